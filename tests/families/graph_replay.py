"""A recurrent decode step checked as a CUDA graph: captured once, replayed over new inputs, equal to eager steps."""
import torch


def assert_replays_like_eager(step, fresh, write_inputs, steps: int = 6) -> None:
    """step(*states) -> output, updating the states in place, reading inputs from fixed buffers; fresh() -> new zero
    states; write_inputs() writes the next inputs into those buffers. Captured once on its own states and replayed,
    each output and the final states equal step's eager run on a second set (no host sync inside)."""
    graph_states, eager_states = fresh(), fresh()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*(s.clone() for s in graph_states))                       # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*graph_states)
    for s in graph_states:
        s.zero_()
    for _ in range(steps):
        write_inputs()
        graph.replay()
        torch.testing.assert_close(out, step(*eager_states))
    for replayed, eager in zip(graph_states, eager_states):
        torch.testing.assert_close(replayed, eager)
