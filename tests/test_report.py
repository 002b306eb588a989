"""PNG reports: files written, CSVs hold what is plotted, bad input rejected."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from planner.io import catalog
from planner.io.report import Case, batch_ladder, memory_table, roofline_table, throughput_table
from planner.layouts.deployment import Deployment, Layout

SERVERS = Path(__file__).resolve().parent / "fixtures" / "servers"


def test_batch_ladder():
    assert batch_ladder(117) == [1, 2, 4, 8, 16, 32, 64, 117]
    assert batch_ladder(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_ladder(117, beyond=True)[-1] == 234
    assert batch_ladder(0) == [1]


def test_report_cli_writes_pngs_and_csvs(run_cli, tmp_path):
    code, out, err = run_cli("report", "-m", "llama-3.1-8b", "-g", "h100-sxm,a100-sxm-80gb",
                             "--weights", "bf16,fp8", "--out", str(tmp_path),
                             "--serving-requests", "0")
    assert code == 0, err
    files = sorted(p.name for p in tmp_path.iterdir())
    # a roofline and a memory chart per GPU and precision (2 x 2) and one throughput chart,
    # each PNG with its CSV
    assert len(files) == 2 * (4 + 4 + 1)
    for p in tmp_path.glob("*.png"):
        with Image.open(p) as im:
            assert im.size[0] > 800 and im.size[1] > 500
    tl = pd.read_csv(next(tmp_path.glob("*throughput_latency*.csv")))
    assert set(tl["case"]) == {"h100-sxm bf16", "h100-sxm fp8", "a100-sxm-80gb bf16",
                               "a100-sxm-80gb fp8"}
    # each curve ends at the largest batch that fits
    for _, sub in tl.groupby("case"):
        assert sub["batch"].iloc[-1] == sub["max_batch"].iloc[0]
        assert sub["fits"].all()


def test_a_gpu_that_cannot_hold_the_model_gets_its_memory_chart_only(run_cli, tmp_path):
    """Llama-3.1-70B in bf16 (141 GB) on one H100 beside an MI300X: the H100 holds no batch,
    so its throughput point, roofline ladder and serving run would be of a deployment that
    cannot load. It is drawn in memory only, said on stderr; the MI300X gets every chart,
    its serving run included."""
    code, out, err = run_cli("report", "-m", "llama-3.1-70b", "-g", "mi300x,h100-sxm",
                             "--out", str(tmp_path), "--serving-requests", "40")
    assert code == 0, err
    names = {p.name for p in tmp_path.iterdir()}
    assert "llama-3.1-70b_h100-sxm_bf16_memory.png" in names
    assert not any("h100-sxm" in n and "memory" not in n for n in names)
    assert {"llama-3.1-70b_mi300x_bf16_roofline.png", "llama-3.1-70b_serving_bf16.png"} <= names
    tl = pd.read_csv(next(tmp_path.glob("*throughput_latency*.csv")))
    assert set(tl["case"]) == {"mi300x bf16"} and tl["fits"].all()
    assert "h100-sxm bf16: llama-3.1-70b does not fit at batch 1" in " ".join(err.split())
    # none fits: the memory chart alone, still exit 0
    code, out, err = run_cli("report", "-m", "llama-3.1-70b", "-g", "h100-sxm,h100-sxm",
                             "--weights", "bf16,bf16", "--out", str(tmp_path / "one"))
    assert code == 0 and sorted(p.name for p in (tmp_path / "one").iterdir()) == [
        "llama-3.1-70b_h100-sxm_bf16_memory.csv", "llama-3.1-70b_h100-sxm_bf16_memory.png"]


def test_roofline_points_lie_under_the_roof():
    case = Case(Deployment.build(catalog.load_model("mixtral-8x7b"),
                                 catalog.load_hardware("h100-sxm"), layout=Layout(tp=2)),
                1024, 128)
    df = roofline_table(case, 8)
    peak, bw = df["peak_flops_per_s"].iloc[0], df["bandwidth_bytes_per_s"].iloc[0]
    roof = (df["intensity_flops_per_byte"] * bw).clip(upper=peak)
    assert (df["attainable_flops_per_s"] <= roof * (1 + 1e-9)).all()
    assert {"decode operators (batch 8)", "prefill operators (batch 8)", "decode step",
            "optimal batch"} <= set(df["series"])


def test_memory_table_shows_overflow():
    case = Case(Deployment.build(catalog.load_model("llama-3.1-8b"), catalog.load_hardware("l4")),
                4096, 512)
    df = memory_table(case)
    assert df["fits"].iloc[:-1].all() and not df["fits"].iloc[-1]
    assert (df["total_bytes"] == df[["weights_bytes", "kv_cache_bytes", "activation_bytes",
                                     "reserve_bytes"]].sum(axis=1)).all()


def test_throughput_rises_with_batch():
    case = Case(Deployment.build(catalog.load_model("llama-3.1-8b"),
                                 catalog.load_hardware("h200")), 512, 128)
    df = throughput_table([case])
    assert df["throughput_tokens_per_s"].is_monotonic_increasing
    assert df["tpot_s"].is_monotonic_increasing


@pytest.mark.parametrize("args,needle", [
    (["-m", "llama-3.1-8b", "-g", "t4"], "t4 has no bf16"),
    (["-m", "llama-3.1-8b", "-g", "h100-sxm", "--weights", "fp5"], "--weights: 'fp5'"),
    (["-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "3"], "--tp 3"),
])
def test_report_bad_input(run_cli, tmp_path, args, needle):
    code, _, err = run_cli("report", *args, "--out", str(tmp_path))
    assert code == 2 and needle in err


def test_report_draws_the_simulated_serving_curve(run_cli, tmp_path):
    import pandas as pd

    code, out, err = run_cli("report", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "512",
                             "-o", "64", "--serving-requests", "40", "--out", str(tmp_path))
    assert code == 0, err
    png = tmp_path / "llama-3.1-8b_serving_bf16.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    df = pd.read_csv(tmp_path / "llama-3.1-8b_serving_bf16.csv")
    assert len(df) == 9 and df["request_rate"].is_monotonic_increasing
    # served never exceeds offered by more than the finite run's edge effects
    low = df[df["load_frac"] <= 0.55]
    assert (low["request_throughput"] <= low["request_rate"] * 1.3).all()
    code, _, err = run_cli("report", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                           "--serving-requests", "-1", "--out", str(tmp_path))
    assert code == 2 and "--serving-requests" in err


def test_labels_never_overlap_each_other_or_the_legend():
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from planner.io.report import Labels

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.1, 1e3)
    ax.set_ylim(1, 1e4)
    ax.plot([1, 10], [10, 100], label="a line")
    labels = Labels(ax)
    for i in range(40):  # 40 labels crowding four points: most must be left out, none overlap
        labels.add(1 + (i % 4), 10 + (i % 4), f"label number {i}", color="black")
    legend = ax.legend(loc="lower right")
    dropped = labels.place(avoid=(legend,))
    r = fig.canvas.get_renderer()
    texts = [t for t in ax.texts]
    assert 0 < len(texts) < 40 and dropped == 40 - len(texts)
    boxes = [Text.get_window_extent(t, r) for t in texts]
    leg = legend.get_window_extent(r)
    frame = ax.get_window_extent(r)
    for i, a in enumerate(boxes):
        assert not a.overlaps(leg)
        assert frame.x0 <= a.x0 and a.x1 <= frame.x1 and frame.y0 <= a.y0 and a.y1 <= frame.y1
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)
    plt.close(fig)


def test_roofline_axis_reaches_down_to_cpu_measurements():
    from planner.io.report import roofline_ylim

    df = pd.DataFrame({"attainable_flops_per_s": [1e12, 2e9]})  # a CPU step at 2 GFLOP/s
    lo, hi = roofline_ylim(df, 989e12, {"bandwidth_bytes_per_s": 23e9, "flops_per_s": 2e11})
    assert lo <= 1e9 and hi == pytest.approx(3 * 989e12)
    lo, _ = roofline_ylim(pd.DataFrame({"attainable_flops_per_s": [1e14]}), 989e12, None)
    assert lo == pytest.approx(989e12 / 1e5)  # five decades when every point is above it


def _text_overlaps(fig) -> list[tuple[str, str]]:
    """Pairs of visible texts of ``fig`` (titles, labels, ticks, legends, annotations) whose
    boxes overlap, measured with the renderer (an annotation's box without its arrow)."""
    import itertools

    from matplotlib.text import Text

    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ticks, drawn = set(), []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks |= {id(tick.label1), id(tick.label2)}
            for tick in axis._update_ticks():  # those inside the view: the ones drawn
                drawn += [t for t in (tick.label1, tick.label2) if t.get_visible()]
    texts = [t for t in fig.findobj(Text) if id(t) not in ticks and t.get_visible()] + drawn
    boxes = []
    for t in texts:
        if not t.get_text().strip():
            continue
        bb = Text.get_window_extent(t, r)
        if bb.width >= 1 and bb.height >= 1:
            boxes.append((t.get_text(), bb.expanded(0.98, 0.9)))
    return [(a[:30], b[:30]) for (a, A), (b, B) in itertools.combinations(boxes, 2)
            if A.overlaps(B)]


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["report", "-m", "llama-3.1-8b", "-g", "h100-sxm,a100-sxm-80gb", "--weights", "bf16,fp8",
     "--serving-requests", "60"],
    ["report", "-m", "deepseek-v3", "-g", "h200", "--weights", "fp8", "--tp", "8", "--ep", "8",
     "--serving-requests", "0"],
    ["plan", "-m", "llama-3.1-70b", "-p", "2048", "-o", "256", "--ttft", "3s", "--tpot", "50ms",
     "--rps", "20", "--top", "3"],
    ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "200", "--request-rate", "8"],
    # the roofline where a decode step's matmuls bunch at 8-32 FLOP/B beside the batch ladder,
    # and (fp8) a prefill label reaching for the ridge point's note
    ["report", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "4", "-p", "2048", "-o", "256",
     "-b", "32", "--weights", "bf16,fp8", "--serving-requests", "0"],
    ["compare", *(str(SERVERS / f) for f in (
        "vllm_bench_serve.json", "sglang_bench_serving.jsonl", "guidellm_report.json",
        "genai_perf_profile_export.json")), "-m", "llama-3.1-8b", "-g", "h100-sxm"],
    ["validate", "--no-rows", "--source", "gpt-fast-blog,qwen2.5-speed-benchmark,trtllm-v0.9.0,"
     "trtllm-v0.8.0,sglang-bench-one-batch,datacrunch-h200"],
], ids=["report", "report-ep", "plan", "simulate", "roofline-70b-tp4", "compare", "validate"])
def test_no_two_labels_of_a_chart_overlap(run_cli, tmp_path, monkeypatch, args):
    """Issue 26 §3: every chart kind rendered, and no two of its texts overlap."""
    import matplotlib.pyplot as plt

    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    out = ["--out", str(tmp_path)] if args[0] == "report" else ["--plot",
                                                               str(tmp_path / "p.png")]
    code, _, err = run_cli(*args, *out)
    assert code == 0, err
    figs = [f for f in figs if f is not None and not isinstance(f, str)]
    assert figs
    for f in figs:
        assert _text_overlaps(f) == [], f.axes[0].get_title() if f.axes else ""
    if args[0] in ("compare", "validate"):  # predicted-against-measured panels
        (f,) = figs
        r = f.canvas.get_renderer()
        titles = []
        for ax in (a for a in f.axes if a.get_visible()):
            titles.append(ax.get_title())
            # a readable title, not the CSV's key (tpot_s, mean_ttft_s)
            assert "_" not in ax.get_title() and ax.get_title()[0].isupper(), ax.get_title()
            # the key under the axes, over no point
            assert not ax.get_legend().get_window_extent(r).overlaps(ax.get_window_extent(r))
        if args[0] == "compare":  # requests/s and tokens/s never share an axis
            assert {"Requests per second", "Tokens per second"} <= set(titles), titles
    if args[0] == "report" and "h100-sxm,a100-sxm-80gb" in args:
        # a roofline and a memory chart for each GPU and precision, not the first alone
        assert len(list(tmp_path.glob("*_roofline.png"))) == 4
        assert len(list(tmp_path.glob("*_memory.png"))) == 4


def _roofline_figure(monkeypatch, tmp_path, model: str, gpu: str, batch: int, tp: int = 1):
    """The roofline chart of ``model`` on ``gpu`` at ``batch``, as drawn (not closed)."""
    import matplotlib.pyplot as plt

    from planner.io.report import plot_roofline

    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    case = Case(Deployment.build(catalog.load_model(model), catalog.load_hardware(gpu),
                                 engine=catalog.load_engine("vllm"), layout=Layout(tp=tp)),
                2048, 256)
    plot_roofline(case, roofline_table(case, batch), tmp_path)
    (fig,) = figs
    return fig


@pytest.mark.parametrize("model,gpu,batch,tp", [("llama-3.1-8b", "h100-sxm", 16, 1),
                                                ("llama-3.1-70b", "h100-sxm", 32, 4)])
def test_roofline_names_each_operator_once_and_off_the_lines(monkeypatch, tmp_path, model,
                                                            gpu, batch, tp):
    """Issue 26 §3: prefill's lm_head is decode's own point (the last token's logits), and a
    decode step's matmuls bunch at about the batch in FLOP/B: one label names each operator
    of a spot once; and no label sits on the roof, the ceilings or the decode-step line."""
    import re

    from matplotlib.lines import Line2D
    from matplotlib.text import Text

    fig = _roofline_figure(monkeypatch, tmp_path, model, gpu, batch, tp)
    ax = fig.axes[0]
    names = [n for t in ax.texts for n in re.findall(r"[a-z_]+_proj|lm_head|attention",
                                                     t.get_text())]
    # decode and prefill each draw qkv, o, gate_up, down, attention and lm_head: prefill's
    # lm_head shares decode's label, so 11 names, each phase's once
    assert len(names) == 11 and names.count("lm_head") == 1, names
    fig.canvas.draw()  # the positions as drawn on the figure, not savefig's tight crop
    r = fig.canvas.get_renderer()
    lines = [ln for ln in ax.get_lines() if isinstance(ln, Line2D) and len(ln.get_xdata()) > 2]
    assert len(lines) >= 3  # the roof, the achievable ceilings, the decode step
    for t in ax.texts:
        if t.get_text().startswith("ridge point"):
            continue
        box = Text.get_window_extent(t, r)
        for ln in lines:
            path = ln.get_transform().transform_path(ln.get_path())
            dense = path.interpolated(50).vertices
            inside = [(x, y) for x, y in dense if box.contains(x, y)]
            assert not inside, (t.get_text(), ln.get_label())


def test_a_measurement_file_of_only_noisy_points_is_drawn_without_them(run_cli, tmp_path):
    """`llmplan measure` on a busy machine records every point noisy: the report still draws
    the model's charts, says why the measured points are missing, and draws no accuracy
    chart; a file with no point at all, clean or noisy, stays an error."""
    import json

    fixture = Path(__file__).resolve().parent / "fixtures" / "measure" / "cpu-results.jsonl"
    recs = [json.loads(x) for x in fixture.read_text().splitlines()]
    assert any(r["status"] == "ok" for r in recs)
    noisy = tmp_path / "noisy.jsonl"
    noisy.write_text("".join(json.dumps({**r, "status": "noisy", "reason": "busy"} if
                                        r["status"] == "ok" else r) + "\n" for r in recs))
    code, out, err = run_cli("report", "-m", "tiny-llama-test", "-g", "h100-sxm",
                             "--serving-requests", "0", "--measured", str(noisy),
                             "--out", str(tmp_path / "r"))
    assert code == 0 and "every measured point is noisy" in " ".join(err.split())
    assert list((tmp_path / "r").glob("*roofline.png"))
    assert not list((tmp_path / "r").glob("*predicted_vs_measured*"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({**recs[0], "status": "error", "reason": "x"}) + "\n")
    code, _, err = run_cli("report", "-m", "tiny-llama-test", "-g", "h100-sxm",
                           "--measured", str(empty), "--out", str(tmp_path / "e"))
    assert code == 2 and "no measured points (status ok)" in " ".join(err.split())


def test_the_validation_plot_has_a_panel_for_every_served_figure_compared():
    """Every metric a served run is compared on (``METRIC_GROUPS``) has its panel and title in
    validate's plot (served E2E had none: 252 comparisons left out)."""
    from planner.evidence.served import METRIC_GROUPS
    from planner.io.report import METRIC_LABELS, METRIC_TITLES

    for _, metrics in METRIC_GROUPS:
        for m in metrics:
            assert m in METRIC_LABELS and m in METRIC_TITLES, m
