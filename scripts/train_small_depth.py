"""Reproduce the shipped small demo checkpoint's depth-1 skill (the small model's own zoom loop).

Three stages, each continuing the previous one (``train_demo(init_from=...)``), as the
shipped checkpoint was trained on this 2-core CPU (its ``training_history.json`` nests all
three, and the tool-free stage before them):

1. 35 min from the tool-free checkpoint: small_zoom .35, small_after_zoom .35, colour_crop
   .1, draft .2; lr 1e-3. Answers after a crop reach 1.0, boxes only for large objects (the
   model zooms where it sees the object), with a think per object size.
2. 18 min, one think text for both sizes (the region name right before the box), zoom
   weighted .6, lr 6e-4: large objects' boxes 1.0, tiny ones 0.1.
3. 12 min with 85% tiny-object scenes (four dots, one per colour: only the question's region
   name says where to zoom), lr 6e-4: boxes and answers 1.0 for both sizes (step 1,050).

The first stage was trained with the two-think world of its day; rerunning it with today's
world (one think) is expected to reach the same end sooner (not measured).

    .venv/bin/python scripts/train_small_depth.py OUT_DIR
"""

import sys
from pathlib import Path

from speceyes_graph.demo import demo_checkpoints
from speceyes_graph.demo.training import train_demo

out = Path(sys.argv[1] if len(sys.argv) > 1 else "small-depth")
loop = {"small_zoom": 0.35, "small_after_zoom": 0.35, "colour_crop": 0.1, "draft": 0.2}
boxes = {"small_zoom": 0.6, "small_after_zoom": 0.15, "colour_crop": 0.05, "draft": 0.2}
stages = [
    dict(minutes=35, lr=1e-3, warmup=30, task_weights=loop),
    dict(minutes=18, lr=6e-4, warmup=20, task_weights=boxes),
    dict(minutes=12, lr=6e-4, warmup=20, task_weights=boxes, tiny_share=0.85),
]
previous = demo_checkpoints()["small"]
for i, stage in enumerate(stages, 1):
    previous = train_demo(
        out / f"stage{i}", "small", init_from=previous, colour_steps=0, eval_every=150, **stage
    )
print(f"the depth-1 small checkpoint: {previous}")
