"""The 1F1B schedule and the expert all-to-all read from one rank's trace (calibrate/trace_pipeline.py).

The traces are written from a discrete-event 1F1B schedule of Megatron's blocking exchanges (each stage's ops
in estimator/exchanges.stage_calls order), whose op times the tests choose, so the expectations are the
schedule's, not the reader's arithmetic."""
import json

import pytest
from scaleplan.calibrate.trace import read_trace
from scaleplan.calibrate.trace_pipeline import summary
from scaleplan.estimator.exchanges import stage_calls

US = 1000.0  # the tests' op times are in ms, the trace in us


def _timeline(pp, n, tf, tb, t_x=0.0):
    """Per stage: [("F"|"B", start, end) and ("X", start, end)] of a 1F1B step with blocking exchanges, ms."""
    ops = [stage_calls(s, pp, n, tf[s], tb[s]) for s in range(pp)]
    pos, clock, out = [0] * pp, [0.0] * pp, [[] for _ in range(pp)]
    posted, count, mine = {}, {}, [None] * pp
    while any(pos[s] < len(ops[s]) for s in range(pp)):
        for s in range(pp):
            while pos[s] < len(ops[s]):
                kind, what = ops[s][pos[s]]
                if kind == "C":
                    out[s].append(("F" if what == tf[s] else "B", clock[s], clock[s] + what))
                    clock[s] += what
                elif mine[s] is None:
                    mine[s] = (clock[s], [])
                    for k, peer in what:
                        src, dst = (s, peer) if k == "send" else (peer, s)
                        i = count.get((src, dst, k), 0)
                        count[(src, dst, k)] = i + 1
                        posted[(src, dst, i, k)] = clock[s]
                        mine[s][1].append((src, dst, i))
                    continue
                elif all((a, b, i, "send") in posted and (a, b, i, "recv") in posted for a, b, i in mine[s][1]):
                    t0 = mine[s][0]
                    clock[s] = max(max(posted[(a, b, i, "send")], posted[(a, b, i, "recv")])
                                   for a, b, i in mine[s][1]) + t_x
                    out[s].append(("X", t0, clock[s]))
                    mine[s] = None
                else:
                    break
                pos[s] += 1
    return out


def _write(path, ops, a2a=(), compute=()):
    """A rank's trace: the schedule's passes as python_function events (a user forward_step nested in each
    forward, as pretrain_gpt's is), each exchange as a p2p call, one kernel per pass; ``a2a``: (start, end)
    of NCCL kernels launched inside token_dispatch; ``compute``: (start, end) kernels on another stream."""
    ev, corr = [], 0

    def x(cat, name, ts, dur, tid=1, pid=1, **args):
        e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
        if args:
            e["args"] = args
        ev.append(e)

    def kernel(name, start, dur, launch, stream):
        nonlocal corr
        corr += 1
        x("cuda_runtime", "cudaLaunchKernel", launch, 1.0, correlation=corr)
        x("kernel", name, start, dur, tid=stream, pid=0, correlation=corr, stream=stream)

    for kind, a, b in ops:
        a, b = a * US + 10, b * US + 10
        if kind == "X":
            x("python_function", "megatron/core/pipeline_parallel/p2p_communication.py(500): send_forward", a, b - a)
            continue
        fn = "forward_step" if kind == "F" else "backward_step"
        x("python_function", f"megatron/core/pipeline_parallel/schedules.py(403): {fn}", a, b - a)
        if kind == "F":
            x("python_function", "pretrain_gpt.py(200): forward_step", a + 1, b - a - 2)
        kernel("sm100_xmma_gemm", a + 2, b - a - 4, a + 1, 7)
    for a, b in a2a:
        x("python_function", "megatron/core/transformer/moe/token_dispatcher.py(682): token_dispatch", a - 2, 3)
        kernel("ncclDevKernel_SendRecv", a, b - a, a - 1, 13)
    for a, b in compute:
        kernel("sm100_xmma_gemm", a, b - a, a - 1, 9)
    end = max(e["ts"] + e["dur"] for e in ev) + 10
    x("user_annotation", "ProfilerStep#1", 0, end)
    path.write_text(json.dumps({"traceEvents": ev}))
    return path


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_round_trip_at_the_other_stages_periods_when_the_last_stage_is_heavier(tmp_path, stage):
    # PP 4, 8 micro-batches: stages 0-2 forward 10 / backward 30 ms (q = 40), the last one 20 / 40 (p = 60,
    # its LM head); the schedule with fixed op times runs the hops at q: the round trip on stage s is
    # f + (PP - s - 2) q + p, (PP - s - 2) q / p + 1 + f / p periods, below the pacing hops' PP - s - 1 + f / p
    pp, n, f, q, p = 4, 8, 10.0, 40.0, 60.0
    ops = _timeline(pp, n, [f, f, f, 20.0], [30.0, 30.0, 30.0, 40.0])
    tr = read_trace(_write(tmp_path / "r.json", ops[stage]))
    got = summary(tr.schedule, pp, stage, n, 2)
    assert got["forwards_before_backward"] == pp - stage  # PP - s - 1 warm-up forwards and one steady one
    assert got["steady_period_s"] == pytest.approx(p / US)
    assert got["round_trip_periods"] == pytest.approx((pp - stage - 2) * q / p + 1 + f / p)
    assert got["round_trip_pacing"] == pytest.approx(pp - stage - 1 + f / p)
    assert got["round_trip_periods"] < got["round_trip_pacing"]


def test_equal_stages_give_the_pacing_round_trip_and_exchange_waits(tmp_path):
    pp, n = 4, 8
    ops = _timeline(pp, n, [10.0] * pp, [30.0] * pp, t_x=2.0)
    got = summary(read_trace(_write(tmp_path / "r.json", ops[0])).schedule, pp, 0, n, 2)
    assert got["round_trip_periods"] == pytest.approx(got["round_trip_pacing"])
    xs = sorted(b - a for k, a, b in ops[0] if k == "X")  # stage 0's exchange calls, as the schedule ran them
    assert got["exchanges_per_step"] == len(xs)
    assert got["exchange_max_s"] == pytest.approx(xs[-1] / US)
    assert got["exchange_s_per_step"] == pytest.approx(sum(xs) / US)


def test_all_to_all_kernels_counted_and_their_hidden_share(tmp_path):
    # two all-to-alls of 10 us inside token_dispatch; a compute kernel on another stream covers 4 us of the first
    ops = _timeline(2, 2, [10.0, 10.0], [30.0, 30.0])
    path = _write(tmp_path / "r.json", ops[0], a2a=[(200_000, 200_010), (300_000, 300_010)],
                  compute=[(200_006, 200_020)])
    got = summary(read_trace(path).schedule, 2, 0, 2, 1)
    assert got["a2a_per_layer_mb"] == pytest.approx(2 / (2 * 1))
    assert got["a2a_s"] == pytest.approx(20e-6)
    assert got["a2a_hidden_share"] == pytest.approx(4 / 20)


def test_a_trace_without_python_stacks_says_so(tmp_path):
    ev = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
           "args": {"correlation": 1}},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 3, "dur": 5, "args": {"correlation": 1}}]
    (tmp_path / "r.json").write_text(json.dumps({"traceEvents": ev}))
    got = summary(read_trace(tmp_path / "r.json").schedule, 4, 0, 8, 2)
    assert got["forwards_per_step"] == 0 and got["round_trip_periods"] is None and got["exchange_median_s"] is None
