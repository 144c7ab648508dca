"""Progress bars in a log: a few plain lines, not one redraw per update."""

import io

from speceyes_graph.progress import progress_bar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_written_to_a_file_is_a_few_plain_lines():
    log = io.StringIO()
    bar = progress_bar(total=5000, desc="bench", unit="q", file=log, position=2)
    for i in range(5000):
        bar.set_postfix(done=i)  # redraws at once on a terminal
        bar.update(1)
    bar.close()
    text = log.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and "\x1b" not in text  # no redraws, no cursor movement
    assert len(lines) <= 3 and len(text) < 400
    assert lines[0].startswith("bench:   0%") and "5000/5000" in lines[-1]
    assert "done=4999" in lines[-1]  # the last line has the last postfix


def test_a_bar_on_a_terminal_redraws_in_place():
    tty = Terminal()
    bar = progress_bar(range(50), desc="synth", file=tty, mininterval=0)
    for _ in bar:
        pass
    assert tty.getvalue().count("\r") > 10


def test_a_wrapped_iterable_still_yields_everything():
    assert list(progress_bar(iter(range(7)), total=7, file=io.StringIO())) == list(range(7))
