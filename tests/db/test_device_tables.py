"""An 8-GPU H100 / H200 node type whose tables are measured: the paper's recorded H100 dense GEMMs and H200
attention and top-k (../shared, read at test time) beside scaleplan's own single-GPU tables of the same GPU
(cluster_profiles/recorded), each component labelled with whose rows measure it."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from scaleplan.db import session as dbs
from scaleplan.db.measurements import FROM_PROFILE, coverage, load_frames
from scaleplan.db.recorded import default_recorded_dir, import_recorded_dir
from scaleplan.errors import SpecError
from scaleplan.profiles import profile_file

DEVICE = ("grouped_gemm", "sdpa", "router", "elementwise", "vocab", "allocator")


@pytest.fixture(scope="module")
def both_db(tmp_path_factory, recorded_db) -> str:
    """recorded_db (the paper's tables) with scaleplan's own recorded tables imported beside them."""
    path = tmp_path_factory.mktemp("both") / "both.db"
    src, dst = sqlite3.connect(recorded_db.removeprefix("sqlite:///")), sqlite3.connect(str(path))
    with dst:
        src.backup(dst)
    src.close()
    dst.close()
    url = f"sqlite:///{path}"
    with dbs.session_scope(url) as s:
        import_recorded_dir(s, default_recorded_dir())
    return url


def test_h100_node_takes_the_single_gpu_device_tables_and_its_device_timed_gemms_first(both_db, recorded_dir):
    fr = load_frames(both_db, "p5.48xlarge")
    gemm = pd.read_parquet(recorded_dir / "gemm_util.parquet").reset_index()
    ok = (gemm["GPU_MODEL"] == "H100") & (gemm["status"] == "OK")
    lender = load_frames(both_db, "h100-single")  # the single-GPU machine's own tables
    # device_tables_first: [gemm]: the lender's bf16 rows in place of the recorded bf16 ones; the recorded
    # kinds the lender has none of (fp16) stay
    whose = fr["gemm"].groupby(["dtype", FROM_PROFILE]).size().to_dict()
    assert whose == {("bf16", "h100-single"): len(lender["gemm"]),
                     ("fp16", "p5.48xlarge"): int((ok & (gemm["dtype"] == "fp16")).sum())}
    for suite in DEVICE:
        assert set(fr[suite][FROM_PROFILE]) == {"h100-single"}, suite
        assert len(fr[suite]) == len(lender[suite]) > 0, suite
    # the host's launch gap and the fabric are the node type's own: never lent
    assert not lender["dispatch"].empty and fr["dispatch"].empty and fr["collectives"].empty


def test_the_recorded_h100_gemms_hold_a_per_call_floor_the_device_timed_rows_do_not(both_db, recorded_dir):
    """Why p5.48xlarge reads its dense GEMMs from h100-single first: the recorded rows sit on a flat floor over
    decades of work far above the device-timed shortest call, and run slower than the device-timed rows of the
    same shapes at the sizes a micro-batch's GEMMs have, while agreeing where the work dwarfs any per-call cost."""
    from scaleplan.estimator.floors import detect_floor

    gemm = pd.read_parquet(recorded_dir / "gemm_util.parquet").reset_index()
    rec = gemm[(gemm["GPU_MODEL"] == "H100") & (gemm["status"] == "OK") & (gemm["dtype"] == "bf16")]
    rec = rec.assign(t_s=rec["time_ms_med"] / 1e3)
    own = load_frames(both_db, "h100-single")["gemm"]
    own = own[own["dtype"] == "bf16"]
    floor = detect_floor(2.0 * rec["M"] * rec["N"] * rec["K"], rec["t_s"])
    assert floor is not None and floor.decades > 5 and floor.t_s > 2.0 * own["t_s"].min()
    both = rec.merge(own, left_on=["M", "N", "K"], right_on=["m", "n", "k"], suffixes=("_rec", "_own"))
    ratio, work = both["t_s_rec"] / both["t_s_own"], 2.0 * both["M"] * both["N"] * both["K"]
    assert len(both) > 100
    assert ratio[(work >= 1e10) & (work < 1e11)].median() > 1.3
    assert abs(ratio[work >= 1e12].median() - 1.0) < 0.05


@pytest.mark.parametrize("line, bad", [("device_tables_first: [sdpa2]\n", "sdpa2"),
                                       ("device_tables_first: [collectives]\n", "collectives")])
def test_device_tables_first_names_a_device_suite_in_one_line(tmp_path, line, bad):
    p = Path(_profile_yaml(tmp_path, ["h100-single"]))
    p.write_text(p.read_text() + line)
    with pytest.raises(SpecError) as e:
        profile_file(str(p))
    msg = str(e.value)
    assert "device_tables_first" in msg and bad in msg and "gemm" in msg and "\n" not in msg


def test_the_suites_a_profile_may_take_first_are_the_device_suites():
    from typing import get_args

    from scaleplan.db.measurements import DEVICE_SUITES
    from scaleplan.profiles import DeviceSuite

    assert set(get_args(DeviceSuite)) == set(DEVICE_SUITES)


def test_device_tables_first_without_a_lender_is_refused(tmp_path):
    p = Path(_profile_yaml(tmp_path, []))
    p.write_text(p.read_text() + "device_tables_first: [gemm]\n")
    with pytest.raises(SpecError, match="device_tables_first"):
        profile_file(str(p))


def test_h200_node_takes_only_the_kinds_of_rows_it_lacks(both_db):
    fr = load_frames(both_db, "p5en.48xlarge")
    router = fr["router"]
    whose = router.groupby(["variant", FROM_PROFILE]).size().to_dict()
    # top-k (fp32) is the paper's H200 table; permute / unpermute / the gating GEMM only scaleplan measured
    assert ("topk", "p5en.48xlarge") in whose and ("topk", "h200-single") not in whose
    assert {("permute", "h200-single"), ("unpermute", "h200-single")} <= set(whose)
    sdpa = fr["sdpa"].groupby(["backend", FROM_PROFILE]).size().to_dict()
    assert ("te", "p5en.48xlarge") in sdpa and ("cudnn", "h200-single") in sdpa


def test_coverage_names_every_suite_and_who_measured_it(both_db):
    prof = profile_file("p5.48xlarge")
    rows = {r["suite"]: r for r in coverage(load_frames(both_db, "p5.48xlarge"), prof.dispatch.source)}
    assert rows["grouped_gemm"]["source"] == "measured"
    n = len(load_frames(both_db, "h100-single")["grouped_gemm"])
    assert rows["grouped_gemm"]["from"] == {"h100-single": {"bf16": n}}
    assert rows["collectives"]["source"] == "analytic" and rows["collectives"]["from"] == {}
    assert rows["dispatch"]["source"].startswith("profile law")
    # no FP8 GEMM of the H100 is measured: its FP8 table is composed from the H200's two dtypes (same die)
    h200 = load_frames(both_db, "h200-single")["gemm"]
    assert rows["gemm"]["from"]["h200-single (FP8 / bf16 ratio)"] == h200.groupby("dtype").size().to_dict()
    h200_rows = {r["suite"]: r for r in coverage(load_frames(both_db, "h200-single"))}
    assert set(h200_rows["gemm"]["from"]) == {"h200-single"}  # its own FP8 rows: nothing composed


def test_estimate_on_the_h100_node_reads_measured_experts_and_attention(both_db):
    from scaleplan.estimator.api import Estimator

    from scaleplan.specs import Layout, parse_spec

    spec = parse_spec({"model": {"n_layers": 4, "hidden_sz": 1024, "inter_sz": 2048, "n_q_heads": 8,
                                 "n_kv_heads": 8, "head_dim": 128, "vocab_sz": 32000,
                                 "moe": {"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 1024}},
                       "data": {"gbs": 64, "seqlen": 2048}, "hardware": {"node_type": "p5.48xlarge"}})
    r = Estimator("p5.48xlarge", both_db).estimate(spec, 8, [Layout(ep=8, mbs=1, ckpt="none")])[0]
    for comp in ("experts", "sdpa", "router", "elementwise", "vocab", "attn_proj"):
        assert r.sources[comp] != "analytic", (comp, r.sources[comp])


def _profile_yaml(tmp_path, lenders: list[str], gpu: str = "NVIDIA H100 80GB HBM3") -> str:
    p = tmp_path / "node.yaml"
    p.write_text(f"name: node\ngpu_name: {gpu}\ngpus_per_node: 8\npeak_flops: {{bf16: 9.89e14}}\n"
                 "hbm_bytes: 80e9\nhbm_bandwidth: 3.35e12\nscaleup_bandwidth: 450e9\nscaleout_bandwidth: 50e9\n"
                 f"device_tables: [{', '.join(lenders)}]\n")
    return str(p)


@pytest.mark.parametrize("lender, why", [("h200-single", "same GPU"), ("nope", "another built-in profile")])
def test_a_lender_of_another_gpu_or_unknown_is_refused_in_one_line(tmp_path, lender, why):
    with pytest.raises(SpecError) as e:
        profile_file(_profile_yaml(tmp_path, [lender]))
    msg = str(e.value)
    assert "device_tables" in msg and lender in msg and why in msg and "\n" not in msg


@pytest.mark.parametrize("gpu, other, why", [("NVIDIA H100 80GB HBM3", "p6-b200.48xlarge", "same die"),
                                             ("NVIDIA B200", "h200-single", "same die"),
                                             ("NVIDIA H100 80GB HBM3", "nope", "another built-in profile")])
def test_an_fp8_ratio_profile_off_the_die_or_unknown_is_refused_in_one_line(tmp_path, gpu, other, why):
    """fp8_ratio_tables must name a profile of a GPU on this GPU's die (an H200 for an H100); a B200's or an
    unknown profile's ratio would stand in for another chip's lanes."""
    p = tmp_path / "node.yaml"
    p.write_text(open(_profile_yaml(tmp_path, [], gpu)).read() + f"fp8_ratio_tables: [{other}]\n")
    with pytest.raises(SpecError) as e:
        profile_file(str(p))
    msg = str(e.value)
    assert "fp8_ratio_tables" in msg and other in msg and why in msg and "\n" not in msg
    ok = tmp_path / "ok.yaml"
    ok.write_text(open(_profile_yaml(tmp_path, [], "NVIDIA H100 80GB HBM3")).read() + "fp8_ratio_tables: [h200-single]\n")
    assert profile_file(str(ok)).fp8_ratio_tables == ("h200-single",)


B200, GB200 = "p6-b200.48xlarge", "p6e-gb200.36xlarge"
B300, GB300 = "p6-b300.48xlarge", "p6e-gb300.36xlarge"


@pytest.mark.parametrize("part", [GB200, B300, GB300])
def test_a_blackwell_part_takes_the_b200_rows_at_its_own_clocks(recorded_db, part):
    """A GB200, B300 or GB300 has no table of its own: each B200 row stands in with its time scaled by the two
    datasheets, the tensor-core kinds by the dense peaks at the row's dtype, the rest by the HBM bandwidths."""
    gb, b = profile_file(part), profile_file(B200)
    mine, theirs = load_frames(recorded_db, part), load_frames(recorded_db, B200)
    for suite, col in (("gemm", "t_s"), ("sdpa", "fwd_s"), ("router", "fwd_s"), ("vocab", "bwd_s")):
        m, t = mine[suite].set_index("id"), theirs[suite].set_index("id")
        assert len(m) == len(t) > 0 and set(m[FROM_PROFILE]) == {B200}, suite
        for i in t.index[:: max(1, len(t) // 25)]:
            dt, op = str(t.at[i, "dtype"]), str(t.at[i, "op"]) if "op" in t else ""
            on_tc = suite in ("gemm", "sdpa") or op == "lm_head_gemm"
            f = b.peak_flops[dt] / gb.peak_flops[dt] if on_tc else b.hbm_bandwidth / gb.hbm_bandwidth
            assert m.at[i, col] == pytest.approx(t.at[i, col] * f, rel=1e-12), (suite, i)
    assert {"bf16", "fp8"} <= set(mine["gemm"]["dtype"].astype(str))  # both lanes, each at its own ratio
    assert mine["dispatch"].empty  # the host is never lent
    # the fabric is lent only where the node's is the lender's (fabric_tables: a B300's; a GB200 / GB300 tray's not)
    assert mine["collectives"].empty == (B200 not in gb.fabric_tables)
    rows = {r["suite"]: r for r in coverage(mine)}
    assert rows["sdpa"]["source"] == "composed" and set(rows["sdpa"]["from"]) == {f"{B200} (scaled to this part)"}
    assert rows["collectives"]["source"] == ("measured" if gb.fabric_tables else "analytic")


def test_an_estimate_on_gb200_reads_the_scaled_rows_labelled_composed(recorded_db):
    from scaleplan.estimator.api import Estimator

    from scaleplan.specs import Layout, parse_spec

    def at(profile):
        spec = parse_spec({"model": {"n_layers": 4, "hidden_sz": 2048, "inter_sz": 4096, "n_q_heads": 16,
                                     "n_kv_heads": 8, "head_dim": 128, "vocab_sz": 32000,
                                     "moe": {"n_experts": 16, "experts_per_token": 2, "expert_inter_sz": 1024}},
                           "data": {"gbs": 16, "seqlen": 4096}, "hardware": {"node_type": profile}})
        return Estimator(profile, recorded_db, use_calibration=False).estimate(
            spec, 4, [Layout(ep=4, mbs=1, ckpt="none")])[0]

    gb, b = at(GB200), at(B200)
    for comp in ("experts", "sdpa", "attn_proj"):
        assert b.sources[comp] != "composed" and gb.sources[comp] == "composed", comp
    said = [w for w in gb.warnings if w.startswith("composed from another part")]
    assert len(said) == 1 and f"sdpa ({B200})" in said[0] and not any("another part" in w for w in b.warnings)
    ratio = profile_file(B200).peak("bf16") / profile_file(GB200).peak("bf16")
    assert gb.breakdown_s["sdpa"] == pytest.approx(b.breakdown_s["sdpa"] * ratio, rel=1e-9)
    assert gb.breakdown_s["attn_proj"] == pytest.approx(b.breakdown_s["attn_proj"] * ratio, rel=1e-9)


@pytest.mark.parametrize("gpu, other, why", [("NVIDIA GB200", "p6e-gb200.36xlarge", "another built-in profile"),
                                             ("NVIDIA GB200", "nope", "another built-in profile"),
                                             ("NVIDIA GB200", "h200-single", "same tensor-core generation"),
                                             ("NVIDIA B300", "h200-single", "same tensor-core generation"),
                                             ("NVIDIA H100 80GB HBM3", "p6-b200.48xlarge",
                                              "same tensor-core generation"),
                                             ("NVIDIA B200", "p6-b200.48xlarge", "device_tables")])
def test_a_scaled_lender_must_be_another_part_of_the_generation(tmp_path, gpu, other, why):
    """scaled_device_tables names another GPU model of this GPU's tensor-core generation (a B200 for a GB200 or a
    B300); the same model is lent unscaled (device_tables), another generation's rows would stand in for other
    tensor cores."""
    p = tmp_path / "node.yaml"
    p.write_text(Path(_profile_yaml(tmp_path, [], gpu)).read_text() + f"scaled_device_tables: [{other}]\n")
    if other == "p6e-gb200.36xlarge":  # a profile of that name is built in: this file is another one
        p.write_text(p.read_text().replace("name: node", f"name: {other}"))
    with pytest.raises(SpecError) as e:
        profile_file(str(p))
    msg = str(e.value)
    assert "scaled_device_tables" in msg and other in msg and why in msg and "\n" not in msg


def test_the_provenance_says_whose_rows_come_first(both_db):
    """An answer's provenance names the lender and that its rows stand in place of the profile's own dense GEMMs."""
    from scaleplan.estimator.api import Estimator
    from scaleplan.report.provenance import provenance

    p = provenance(Estimator("p5.48xlarge", both_db))
    lent = next(b for b in p["borrowed"] if b["profile"] == "h100-single")
    assert lent["how"] == "lent (in place of its own: gemm)" and lent["table_runs"]
    assert {r["suite"] for r in lent["table_runs"]} >= {"gemm", "grouped_gemm"}


def test_a_b300_holds_the_published_b300_layout_that_a_b200_cannot(recorded_db):
    """Megatron-Bridge's B300 workload of Qwen3-30B-A3B (8 GPUs, EP 8, micro-batch 8, MXFP8, HybridEP) ran on B300s;
    the same count of Megatron-Core's memory (the allocator rows are lent, the bytes unscaled) is over a B200's HBM
    and within a B300's, as each profile's capacity says."""
    from scaleplan.catalogue import spec_data
    from scaleplan.estimator.api import Estimator
    from scaleplan.units import MEM_FRACTION

    from scaleplan.specs import Layout, parse_spec

    def at(profile):
        doc = spec_data("qwen3-30b-a3b")
        spec = parse_spec({**doc, "model": {**doc["model"], "precision": "fp8"},
                           "data": {**doc["data"], "gbs": 512, "seqlen": 4096, "microbatch_sz": 8},
                           "hardware": {"node_type": profile},
                           "stack": {"dispatcher": "hybridep", "fp8_recipe": "mxfp8", "fp8_param": True,
                                     "permute_fusion": True, "router_fusion": True}})
        est = Estimator(profile, recorded_db, use_calibration=False)
        return est.estimate(spec, 8, [Layout(ep=8, mbs=8, ckpt="none")])[0]

    b, u = at(B200), at(B300)
    assert b.mem_per_device_gb == pytest.approx(u.mem_per_device_gb, rel=1e-9)
    assert profile_file(B200).hbm_bytes * MEM_FRACTION < 1e9 * u.mem_per_device_gb <= profile_file(B300).hbm_bytes
    assert u.feasible and not b.feasible


@pytest.mark.parametrize("part", [B300, GB200, GB300])
def test_a_part_whose_host_is_unmeasured_uses_the_named_profiles_law_and_says_so(part):
    """dispatch_from: the profile takes the law of the profile it names, every term of it, and its source names
    that profile and says this node type's own host was not traced (one place for a law several parts share)."""
    mine, lender = profile_file(part).dispatch, profile_file(B200).dispatch
    terms = ("t_gap_s", "kappa0", "kappa1", "t_ep_host_s", "t_host_s")
    assert [getattr(mine, t) for t in terms] == [getattr(lender, t) for t in terms]
    assert mine.source.startswith(f"{B200}'s law from {lender.source}") and f"{part}'s own host" in mine.source


@pytest.mark.parametrize("extra, why", [("dispatch_from: nope\n", "another built-in profile"),
                                        ("dispatch_from: node\n", "another built-in profile"),
                                        ("dispatch_from: cpu-local\n", "a profile with a dispatch law"),
                                        ("dispatch_from: h100-single\ndispatch: {t_gap_s: 1.0e-5, kappa0: 1, "
                                         "kappa1: 1, source: x}\n", "without a dispatch block")])
def test_a_lent_dispatch_law_that_cannot_be_read_is_refused_in_one_line(tmp_path, extra, why):
    p = tmp_path / "node.yaml"
    p.write_text(Path(_profile_yaml(tmp_path, [])).read_text() + extra)
    with pytest.raises(SpecError) as e:
        profile_file(str(p))
    msg = str(e.value)
    assert "dispatch_from" in msg and why in msg and "\n" not in msg


def _chain_rows(url: str, profile: str, gap_s: float) -> None:
    """A measured dispatch run of ``profile``: launch-bound chains (device busy a tenth of each gap)."""
    from scaleplan.db import models as m

    with dbs.session_scope(url) as s:
        run = m.BenchRun(suite="dispatch", profile=profile, source="measured", status="complete")
        s.add(run)
        s.flush()
        s.add_all([m.DispatchPoint(run_id=run.id, mode="gemm", m=64, n=64, k=64, dtype="bf16", chain_len=n,
                                   wall_per_kernel_s=gap_s, active_per_kernel_s=gap_s / 10) for n in (100, 1000)])


def test_a_lent_law_follows_this_hosts_measured_launch_gap(tmp_path):
    """Once `bench run --suite dispatch` has measured both hosts, a B300's law is p6-b200's traced one times the
    two measured chain gaps' ratio; before, p6-b200's as it is; the lender's own law never moves."""
    from scaleplan.estimator import Estimator

    traced = profile_file(B200).dispatch.t_gap_s
    urls = {}
    for name, hosts in (("lender", {B200: 20e-6}), ("both", {B200: 20e-6, B300: 30e-6})):
        urls[name] = f"sqlite:///{tmp_path / name}.db"
        dbs.upgrade(urls[name])
        for profile, gap in hosts.items():
            _chain_rows(urls[name], profile, gap)
    assert Estimator(B300, urls["lender"], use_calibration=False).dispatch.t_gap_s == pytest.approx(traced)
    assert Estimator(B300, urls["both"], use_calibration=False).dispatch.t_gap_s == pytest.approx(traced * 1.5)
    assert Estimator(B200, urls["both"], use_calibration=False).dispatch.t_gap_s == pytest.approx(traced)


def test_a_b300_takes_the_b200s_collectives_inside_a_node_and_none_across_nodes(recorded_db):
    """fabric_tables: an HGX B300 node has an HGX B200's NVLink fabric, so p6-b200's measured collectives of groups
    inside one node stand in for its own; the groups that leave the node ran over other NICs and are not lent."""
    mine, lender = load_frames(recorded_db, B300)["collectives"], load_frames(recorded_db, B200)["collectives"]
    intra = lender[~lender["inter_node"].astype(bool)]
    assert not intra.empty and lender["inter_node"].astype(bool).any()  # the recorded rows hold both
    assert len(mine) == len(intra) and not mine["inter_node"].astype(bool).any()
    assert set(mine[FROM_PROFILE]) == {B200}


@pytest.mark.parametrize("other, why", [("nope", "another built-in profile"), ("node", "another built-in profile"),
                                        ("h200-single", "same scale-up fabric"),
                                        ("p5.48xlarge", "same scale-up fabric")])
def test_a_fabric_lender_of_another_fabric_is_refused_in_one_line(tmp_path, other, why):
    p = tmp_path / "node.yaml"
    p.write_text(Path(_profile_yaml(tmp_path, [], "NVIDIA B300")).read_text().replace("450e9", "900e9")
                 + f"fabric_tables: [{other}]\n")
    with pytest.raises(SpecError) as e:
        profile_file(str(p))
    msg = str(e.value)
    assert "fabric_tables" in msg and other in msg and why in msg and "\n" not in msg
    p.write_text(p.read_text().replace(f"fabric_tables: [{other}]", f"fabric_tables: [{B200}]"))
    assert profile_file(str(p)).fabric_tables == (B200,)  # 8 GPUs a node on 900 GB/s NVLink, as p6-b200
