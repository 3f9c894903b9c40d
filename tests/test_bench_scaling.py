"""``cpsgd-bench --plot-workers`` with several invocations per worker count, fed
the real results.json of docs/performance.md's Summary (docs/perf/): the "a / b"
table and the plotted mean and spread against numpy on the same files, and the
refusal to average invocations that measured different things; and
docs/perf/exchange_bound_table.py on a results.json without a compute-only job."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mxnet_cpsgd.bench.cli import main
from mxnet_cpsgd.bench.output import scaling_table
from mxnet_cpsgd.bench.scaling import group_by_workers, plotted_points, summary_table

PERF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "perf")
TWICE = {2: ["dilated-scale-n2-a-results.json", "dilated-scale-n2-b-results.json"],
         4: ["dilated-scale-n4-a-results.json", "dilated-scale-n4-b-results.json"]}
ONCE = {8: "dilated-scale-n8-cut-results.json"}


def _load(name):
    with open(os.path.join(PERF, name)) as f:
        return json.load(f)


def _mean_ms(result, algorithm):
    return next(r["mean_ms"] for r in result["rows"] if r["algorithm"] == algorithm)


def _cells(table, label):
    line = next(l for l in table.splitlines() if l.startswith("| %s |" % label))
    return [c.strip() for c in line.strip().strip("|").split("|")[1:]]


def _paths():
    return [os.path.join(PERF, name) for n in sorted(TWICE) for name in TWICE[n]] + \
        [os.path.join(PERF, ONCE[8])]


def test_summary_table_lists_every_invocation_and_its_efficiency():
    results = [json.load(open(p)) for p in _paths()]
    table = summary_table(group_by_workers(results))
    assert table.splitlines()[0] == ("| algorithm | 2 workers (100mbit, x10) | 4 workers "
                                     "(150mbit, x10) | 8 workers (175mbit, x20) |")
    for algorithm in ("ssgd", "bitsgd", "cpsgd", "horovod"):
        expected = []
        for n in (2, 4):
            runs = [_load(name) for name in TWICE[n]]
            ms = [_mean_ms(r, algorithm) for r in runs]
            eff = [r["compute_ms"] / m for r, m in zip(runs, ms)]
            expected.append("%.1f / %.1f (%.2f / %.2f)" % (ms[0], ms[1], eff[0], eff[1]))
        once = _load(ONCE[8])
        expected.append("%.1f (%.2f)" % (_mean_ms(once, algorithm),
                                         once["compute_ms"] / _mean_ms(once, algorithm)))
        assert _cells(table, algorithm) == expected
    compute = ["%.1f / %.1f" % tuple(_load(name)["compute_ms"] for name in TWICE[n])
               for n in (2, 4)] + ["%.1f" % _load(ONCE[8])["compute_ms"]]
    assert _cells(table, "compute only") == compute
    # a variant only the second 2- and 4-worker invocations ran: "-" in the first's place
    assert _cells(table, "bit-wmom") == [
        "- / %.1f (- / %.2f)" % (_mean_ms(_load(TWICE[n][1]), "bit-wmom"),
                                 _load(TWICE[n][1])["compute_ms"]
                                 / _mean_ms(_load(TWICE[n][1]), "bit-wmom"))
        for n in (2, 4)] + ["-"]


def test_plotted_mean_and_spread_match_numpy():
    results = [json.load(open(p)) for p in _paths()]
    groups = group_by_workers(results)
    time_points = plotted_points(groups, "time")
    throughput = plotted_points(groups, "throughput")
    for algorithm in ("ssgd", "cpsgd", "horovod"):
        for point in time_points[algorithm]:
            n = point[0]
            names = TWICE.get(n) or [ONCE[n]]
            ms = np.array([_mean_ms(_load(name), algorithm) for name in names])
            assert point[1:] == pytest.approx((ms.mean(), ms.min(), ms.max(), len(ms)))
            samples = n * 32 / (ms / 1e3)
            tp = next(p for p in throughput[algorithm] if p[0] == n)
            assert tp[1:4] == pytest.approx((samples.mean(), samples.min(), samples.max()))
    ideal = {p[0]: p[1] for p in throughput["compute only"]}
    assert ideal[2] == pytest.approx(np.mean([2 * 32 / (_load(name)["compute_ms"] / 1e3)
                                              for name in TWICE[2]]))


def test_cli_writes_plots_and_tables_of_the_chosen_algorithms(tmp_path, capsys):
    out = tmp_path / "plots"
    assert main(["--plot-workers"] + _paths() + ["--algorithms", "horovod,cpsgd",
                                                 "--out-dir", str(out)]) == 0
    for name in ("time_vs_workers.png", "throughput_vs_workers.png"):
        assert os.path.getsize(str(out / name)) > 0
    text = (out / "scaling.md").read_text()
    assert text == capsys.readouterr().out.split(str(out / "time_vs_workers.png"))[0]
    summary = text.split("\n\n")[0].splitlines()
    assert [line.split("|")[1].strip() for line in summary[2:]] == [
        "compute only", "horovod", "cpsgd"]
    ms = [_mean_ms(_load(name), "cpsgd") for name in TWICE[2]]
    assert _cells(text.split("The plotted points")[1], "cpsgd")[0] == "%.1f (%.1f-%.1f)" % (
        np.mean(ms), min(ms), max(ms))
    assert "- 2 workers: %s / %s" % tuple(os.path.join(PERF, n) for n in TWICE[2]) in text


def test_one_invocation_per_worker_count_is_unchanged(tmp_path):
    paths = [os.path.join(PERF, TWICE[2][0]), os.path.join(PERF, TWICE[4][0]),
             os.path.join(PERF, ONCE[8])]
    assert main(["--plot-workers"] + paths + ["--out-dir", str(tmp_path)]) == 0
    results = [json.load(open(p)) for p in paths]
    assert (tmp_path / "scaling.md").read_text() == scaling_table(results) + "\n"
    # the plots draw each file's own time, labelled by algorithm, without a bar
    points = plotted_points(group_by_workers(results), "time")
    for algorithm in ("ssgd", "cpsgd", "horovod"):
        assert [p[0] for p in points[algorithm]] == [2, 4, 8]
        for point, result in zip(points[algorithm], results):
            ms = _mean_ms(result, algorithm)
            assert point[1:] == pytest.approx((ms, ms, ms, 1))


@pytest.mark.parametrize("key,value,named", [
    ("time_scale", 20, "time scale (%s: 10; %s: 20)"),
    ("rates", ["200mbit"], "rates (%s: 100mbit; %s: 200mbit)"),
    ("batch_size", 64, "batch size (%s: 32; %s: 64)")])
def test_invocations_that_measured_different_things_are_refused(tmp_path, capsys, key,
                                                                value, named):
    first = os.path.join(PERF, TWICE[2][0])
    other = _load(TWICE[2][1])
    other["config"][key] = value
    changed = str(tmp_path / "changed.json")
    with open(changed, "w") as f:
        json.dump(other, f)
    with pytest.raises(SystemExit) as exc:
        main(["--plot-workers", first, changed, "--out-dir", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "the 2-worker results differ in " + named % (first, changed) in err
    assert "averaged into one point" in err
    assert not (tmp_path / "out" / "scaling.md").exists()


def test_unknown_algorithm_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--plot-workers"] + _paths() + ["--algorithms", "cpsgd,nosuch",
                                               "--out-dir", str(tmp_path)])
    assert exc.value.code == 2
    assert "nosuch in none of the results" in capsys.readouterr().err


def test_rerender_of_a_file_without_runs_says_why(tmp_path, capsys):
    path = os.path.join(PERF, ONCE[8])
    assert main(["--rerender", path, "--out-dir", str(tmp_path)]) == 2
    assert "has no 'runs'" in capsys.readouterr().err
    assert not os.listdir(str(tmp_path))


def _table_script(*args):
    return subprocess.run([sys.executable, os.path.join(PERF, "exchange_bound_table.py")]
                          + [a if a.startswith("--") else os.path.join(PERF, a) for a in args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)


def _row_ms(result, algorithm, rate):
    return next(r["mean_ms"] for r in result["rows"]
                if r["algorithm"] == algorithm and r["rate"] == rate)


def test_exchange_bound_table_without_a_compute_only_job():
    """The 16-worker exchange-bound file was run with --no-compute-only: its
    times are shown, its efficiencies and 'best possible' are '-', a line on
    stderr says why, and the 8-worker column beside it keeps its efficiencies."""
    n8, n16 = "exchange-bound-n8-175-80mbit-results.json", "exchange-bound-n16-90mbit-results.json"
    assert _load(n16)["compute_ms"] is None
    done = _table_script("--across", n8, n16)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "exchange_bound_table.py: no compute-only job in %s: its efficiencies and "
        "'best possible' rows are '-'" % os.path.join(PERF, n16)]
    table = done.stdout.split("### Exchange-bound point")[1]
    eight, sixteen = _load(n8), _load(n16)
    compute = eight["compute_ms"]
    assert _cells(table, "compute only") == ["%.1f" % compute, "-"]
    for algorithm in ("cpsgd", "horovod", "fp16", "cpsgd_fp16"):
        ms8, ms16 = _row_ms(eight, algorithm, "80mbit"), _row_ms(sixteen, algorithm, "90mbit")
        assert _cells(table, algorithm) == ["%.1f (%.2f)" % (ms8, compute / ms8),
                                            "%.1f (-)" % ms16]
    assert _cells(table, "powersgd") == ["%.1f (%.2f)" % (
        _row_ms(eight, "powersgd", "80mbit"), compute / _row_ms(eight, "powersgd", "80mbit")), "-"]
    # a ratio of two times needs no compute-only time
    assert _cells(table, "cpsgd / horovod")[1] == "%.2f" % (
        _row_ms(sixteen, "cpsgd", "90mbit") / _row_ms(sixteen, "horovod", "90mbit"))
    assert _cells(table, "best possible: compute / horovod") == [
        "%.2f" % (compute / _row_ms(eight, "horovod", "80mbit")), "-"]

    alone = _table_script(n16)
    assert alone.returncode == 0, alone.stderr
    assert "(16 workers, compute only -, load " in alone.stdout
    assert _cells(alone.stdout, "cpsgd")[:2] == [
        "%.1f (-)" % _row_ms(sixteen, "cpsgd", "90mbit"),
        "%.1f" % next(r["transfer_bound_ms"] for r in sixteen["rows"]
                      if r["algorithm"] == "cpsgd")]
    assert _cells(alone.stdout, "best possible: compute / fp16") == ["-"]


def test_exchange_bound_table_puts_two_occasions_side_by_side():
    """--across with two files of 2 workers (two occasions) and one of 4: one
    column per worker count, the 2-worker cells "a / b" in the order given, each
    file's efficiency from its own compute-only job, each ratio from its own file."""
    first, second = ("exchange-bound-n2-100-45mbit-results.json",
                     "exchange-bound-n2-100-45mbit-results-2.json")
    four = "exchange-bound-n4-150-70mbit-results.json"
    done = _table_script("--across", first, four, second)
    assert done.returncode == 0, done.stderr
    balanced, bound = done.stdout.split("### Exchange-bound point")
    assert "| algorithm | 2 workers (45mbit, x10) | 4 workers (70mbit, x10) |" in bound
    runs = [_load(first), _load(second)]
    assert _cells(bound, "compute only") == [
        "%.1f / %.1f" % tuple(r["compute_ms"] for r in runs), "%.1f" % _load(four)["compute_ms"]]
    for table, rate in ((balanced, "100mbit"), (bound, "45mbit")):
        for algorithm in ("cpsgd", "horovod", "cpsgd_fp16", "powersgd"):
            ms = [_row_ms(r, algorithm, rate) for r in runs]
            assert _cells(table, algorithm)[0] == "%.1f / %.1f (%.2f / %.2f)" % (
                ms[0], ms[1], runs[0]["compute_ms"] / ms[0], runs[1]["compute_ms"] / ms[1])
        assert _cells(table, "cpsgd_fp16 / horovod")[0] == " / ".join(
            "%.2f" % (_row_ms(r, "cpsgd_fp16", rate) / _row_ms(r, "horovod", rate))
            for r in runs)
    assert "a / b: the files of a worker count in the order given" in done.stdout



def test_exchange_bound_table_joins_files_of_one_point(tmp_path):
    """A worker count's files may hold one point or both: the 16-worker
    exchange-bound-only file (90mbit), the scaling file (180mbit only) and the file
    of both share the column; each cell shows '-' for a file without that point;
    a file with a third rate is refused."""
    xbound, scale, both = ("exchange-bound-n16-90mbit-results.json",
                           "dilated-scale-n16-cut-results.json",
                           "exchange-bound-n16-180-90mbit-results.json")
    done = _table_script("--across", xbound, scale, both)
    assert done.returncode == 0, done.stderr
    balanced, bound = done.stdout.split("### Exchange-bound point")
    assert "| algorithm | 16 workers (180mbit, x40) |" in balanced
    assert "| algorithm | 16 workers (90mbit, x40) |" in bound
    runs = [_load(p) for p in (xbound, scale, both)]
    assert _cells(balanced, "compute only") == ["- / %.1f / %.1f" % (
        runs[1]["compute_ms"], runs[2]["compute_ms"])]
    assert _cells(bound, "compute only") == ["- / - / %.1f" % runs[2]["compute_ms"]]
    cp = [_row_ms(r, "cpsgd", "180mbit") for r in runs[1:]]
    assert _cells(balanced, "cpsgd") == ["- / %.1f / %.1f (- / %.2f / %.2f)" % (
        cp[0], cp[1], runs[1]["compute_ms"] / cp[0], runs[2]["compute_ms"] / cp[1])]
    fp = [_row_ms(r, "cpsgd_fp16", "90mbit") for r in (runs[0], runs[2])]
    assert _cells(bound, "cpsgd_fp16") == ["%.1f / - / %.1f (- / - / %.2f)" % (
        fp[0], fp[1], runs[2]["compute_ms"] / fp[1])]
    fp_vs_horovod = ["%.2f" % (_row_ms(r, "cpsgd_fp16", "90mbit") / _row_ms(r, "horovod", "90mbit"))
                     for r in (runs[0], runs[2])]
    assert _cells(bound, "cpsgd_fp16 / horovod") == ["%s / - / %s" % tuple(fp_vs_horovod)]

    # one column is one point each way: a file with a third rate is refused
    third = _load(xbound)
    third["config"]["rates"] = ["120mbit"]
    for row in third["rows"]:
        row["rate"] = "120mbit"
    path = tmp_path / "third-rate.json"
    path.write_text(json.dumps(third))
    mixed = _table_script("--across", both, str(path))
    assert mixed.returncode != 0
    assert "16-worker files differ in rates" in mixed.stderr
