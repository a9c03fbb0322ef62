import os

from veil.monitoring import trace


def test_each_process_marks_a_file_of_its_own_line_by_line_unless_it_buffers_until_exit(tmp_path, monkeypatch):
    """A forked process (a Spark Python worker, which may be killed without flushing) writes each mark
    as it comes; a process that ends through its cleanup (the gateway) writes them in blocks."""
    monkeypatch.setattr(trace, "DIRECTORY", str(tmp_path))
    monkeypatch.setattr(trace, "_out", None)
    monkeypatch.setattr(trace, "_buffering", 1)
    trace.buffer_until_exit()
    child = os.fork()
    if child == 0:  # forked from a buffering process, marks, then dies without any cleanup
        trace.mark("seen", 0, 5, 123)
        os._exit(0)
    os.waitpid(child, 0)
    assert (tmp_path / f"{child}.trace").read_text() == "seen 0 5 123\n"
    trace.mark("written", 5, 9, 456)
    mine = tmp_path / f"{os.getpid()}.trace"
    assert mine.read_text() == ""  # held until exit
    trace._flush()  # what exit does
    assert mine.read_text() == "written 5 9 456\n"
