"""``cpsgd-bench --plot-workers`` with several invocations per worker count, fed
the real results.json of the performance Summary (reports/perf/): the "a / b"
table and the plotted mean and spread against numpy on the same files, and the
refusal to average invocations that measured different things; ``--plot-rate``
(each file reduced to its fastest or slowest rate) against the rows read here; and
reports/perf/exchange_bound_table.py on a results.json without a compute-only job; the
steady rate of reports/perf/steady_rate.py and exchange_window.py on synthetic runs."""
import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from mxnet_cpsgd.bench.cli import main
from mxnet_cpsgd.bench.output import scaling_table
from mxnet_cpsgd.bench.scaling import (group_by_workers, keep_algorithms, one_rate_of,
                                      plot_title, plotted_points, summary_table)

PERF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reports", "perf")
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


# --plot-rate: each file reduced to its fastest or slowest rate before grouping
XBOUND = {2: ["exchange-bound-n2-100-45mbit-results.json",
              "exchange-bound-n2-100-45mbit-results-2.json"],
          4: ["exchange-bound-n4-150-70mbit-results.json",
              "exchange-bound-n4-150-70mbit-results-2.json"],
          8: ["exchange-bound-n8-175-80mbit-results.json",
              "exchange-bound-n8-175-80mbit-results-2.json"],
          16: ["exchange-bound-n16-180-90mbit-results.json",
               "exchange-bound-n16-90mbit-results.json"]}
BALANCED_ONLY = {2: TWICE[2], 4: TWICE[4], 8: [ONCE[8]],
                 16: ["dilated-scale-n16-cut-results.json"]}
UNIT_BPS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def _bps(rate):
    """Bits per second of '45mbit', '1gbit', '100kbit' (the test's own reading)."""
    number = rate.rstrip("abcdefghijklmnopqrstuvwxyz")
    return float(number) * UNIT_BPS[rate[len(number):]]


def _chosen_rate(result, which):
    pick = max if which == "fastest" else min
    return pick(result["config"]["rates"], key=_bps)


def _cell(runs, algorithm, which):
    """The summary cell of one worker count: each run's mean_ms at its chosen
    rate ('-' where it did not run it) and its efficiency."""
    ms = [next((r["mean_ms"] for r in run["rows"] if r["algorithm"] == algorithm
                and r["rate"] == _chosen_rate(run, which)), None) for run in runs]
    text = " / ".join("-" if m is None else "%.1f" % m for m in ms)
    if len(runs) == 1 and ms[0] is not None and runs[0]["compute_ms"]:
        return "%s (%.2f)" % (text, runs[0]["compute_ms"] / ms[0])
    return "%s (%s)" % (text, " / ".join(
        "-" if m is None or not run["compute_ms"] else "%.2f" % (run["compute_ms"] / m)
        for run, m in zip(runs, ms)))


@pytest.mark.parametrize("which,files", [
    ("slowest", XBOUND),
    # the balanced point: files of both points beside files of that point only
    ("fastest", {n: XBOUND[n][:1] + BALANCED_ONLY[n] for n in (2, 4, 8, 16)})])
def test_plot_rate_tables_hold_the_chosen_rate_of_each_file(tmp_path, capsys, which, files):
    paths = [os.path.join(PERF, name) for n in sorted(files) for name in files[n]]
    assert main(["--plot-workers"] + paths + ["--plot-rate", which, "--algorithms",
                                              "ssgd,cpsgd,horovod,cpsgd_fp16",
                                              "--out-dir", str(tmp_path)]) == 0
    text = (tmp_path / "scaling.md").read_text()
    assert text.startswith("Each results file reduced to its %s rate" % which)
    summary = text.split("\n\n")[1]
    runs = {n: [_load(name) for name in files[n]] for n in files}
    heading = []
    for n in sorted(files):
        rates = {_chosen_rate(r, which) for r in runs[n]}
        assert len(rates) == 1
        heading.append("%d workers (%s, x%g)" % (n, rates.pop(),
                                                 runs[n][0]["config"]["time_scale"]))
    assert summary.splitlines()[0] == "| algorithm | %s |" % " | ".join(heading)
    for algorithm in ("ssgd", "cpsgd", "horovod", "cpsgd_fp16"):
        expected = []
        for n in sorted(files):
            if not any(r["algorithm"] == algorithm for run in runs[n] for r in run["rows"]):
                expected.append("-")
            else:
                expected.append(_cell(runs[n], algorithm, which))
        assert _cells(summary, algorithm) == expected, algorithm
    # one label per algorithm: no "cpsgd @ 45mbit"
    assert "@" not in text
    # the compute-only job is kept
    assert _cells(summary, "compute only")[0] == " / ".join(
        "%.1f" % run["compute_ms"] for run in runs[2])
    # the plotted points are the means of those rows
    reduced = []
    for n in sorted(files):
        reduced += [dict(run, config=dict(run["config"], rates=[_chosen_rate(run, which)]),
                         rows=[r for r in run["rows"] if r["rate"] in
                               ("-", _chosen_rate(run, which))]) for run in runs[n]]
    points = plotted_points(group_by_workers(reduced), "time")
    for n, mean, low, high, count in points["cpsgd"]:
        ms = np.array([r["mean_ms"] for run in runs[n] for r in run["rows"]
                       if r["algorithm"] == "cpsgd" and r["rate"] == _chosen_rate(run, which)])
        assert (mean, low, high, count) == pytest.approx((ms.mean(), ms.min(), ms.max(), len(ms)))


def test_plot_rate_compares_rates_by_value_and_names_the_choice():
    """'1gbit' is faster than '45mbit' and '100kbit' slower (as strings they sort
    the other way); the title says which rate of each file is drawn."""
    result = _load(XBOUND[2][0])
    renamed = {"100mbit": "1gbit", "45mbit": "100kbit"}
    result["config"]["rates"] = ["45mbit", "1gbit", "100kbit"]
    rows = []
    for row in result["rows"]:
        if row["rate"] in renamed:
            rows.append(dict(row, rate=renamed[row["rate"]]))
            if row["rate"] == "45mbit":
                rows.append(dict(row, rate="45mbit", mean_ms=row["mean_ms"] + 1.0))
        else:
            rows.append(row)
    result["rows"] = rows
    for which, rate in (("fastest", "1gbit"), ("slowest", "100kbit")):
        reduced = one_rate_of(result, which)
        assert reduced["config"]["rates"] == [rate]
        assert {r["rate"] for r in reduced["rows"]} == {"-", rate}
        assert [r for r in reduced["rows"] if r["rate"] == rate] == [
            r for r in rows if r["rate"] == rate]
        title = plot_title(group_by_workers([reduced]), which)
        assert "2: %s x10" % rate in title
        assert title.endswith("the %s rate of each results file" % which)
    assert result["config"]["rates"] == ["45mbit", "1gbit", "100kbit"]
    assert "rate of each results file" not in plot_title(group_by_workers([_load(ONCE[8])]))


@pytest.mark.parametrize("which,first,second,rates", [
    ("fastest", "exchange-bound-n16-90mbit-results.json", "dilated-scale-n16-cut-results.json",
     ("90mbit", "180mbit")),
    ("slowest", "exchange-bound-n16-180-90mbit-results.json",
     "dilated-scale-n16-cut-results.json", ("90mbit", "180mbit"))])
def test_plot_rate_refuses_files_of_one_worker_count_at_different_rates(
        tmp_path, capsys, which, first, second, rates):
    first, second = os.path.join(PERF, first), os.path.join(PERF, second)
    with pytest.raises(SystemExit) as exc:
        main(["--plot-workers", first, second, "--plot-rate", which,
              "--out-dir", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "the 16-worker results differ in rates (%s: %s; %s: %s)" % (
        first, rates[0], second, rates[1]) in err
    assert "with --plot-rate %s a file's rate is its %s one" % (which, which) in err
    assert not (tmp_path / "out").exists()


def test_without_plot_rate_two_rate_files_keep_every_rate(tmp_path, capsys):
    """The default is unchanged: a file with two rates gives 'algorithm @ rate'
    labels, and files of one worker count with different rate sets are refused."""
    both = os.path.join(PERF, XBOUND[16][0])
    assert main(["--plot-workers", both, "--algorithms", "cpsgd,horovod",
                 "--out-dir", str(tmp_path)]) == 0
    text = (tmp_path / "scaling.md").read_text()
    assert text == scaling_table([keep_algorithms([_load(XBOUND[16][0])],
                                                  ["cpsgd", "horovod"])[0]]) + "\n"
    assert "| cpsgd @ 180mbit | 16 | 180mbit | %.1f |" % _row_ms(
        _load(XBOUND[16][0]), "cpsgd", "180mbit") in text
    assert "| cpsgd @ 90mbit | 16 | 90mbit | %.1f |" % _row_ms(
        _load(XBOUND[16][0]), "cpsgd", "90mbit") in text
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["--plot-workers", both, os.path.join(PERF, BALANCED_ONLY[16][0]),
              "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.splitlines()[-1]
    assert "differ in rates (%s: 180mbit,90mbit; %s: 180mbit)" % (
        both, os.path.join(PERF, BALANCED_ONLY[16][0])) in err
    assert "--plot-rate" not in err
    with pytest.raises(SystemExit) as exc:
        main(["--rerender", both, "--plot-rate", "fastest"])
    assert exc.value.code == 2
    assert "--plot-rate is used only with --plot-workers" in capsys.readouterr().err


def test_exchange_bound_table_orders_rates_of_any_unit(tmp_path):
    """The balanced point is a file's fastest rate whatever its unit: the 8-worker
    file with 175mbit renamed 1gbit keeps 1gbit as its balanced point."""
    result = _load("exchange-bound-n8-175-80mbit-results.json")
    for row in result["rows"]:
        if row["rate"] == "175mbit":
            row["rate"] = "1gbit"
    path = tmp_path / "gbit-results.json"
    path.write_text(json.dumps(result))
    done = _table_script("--across", str(path))
    assert done.returncode == 0, done.stderr
    balanced, exchange_bound = done.stdout.split("### Exchange-bound point")
    for table, rate in ((balanced, "1gbit"), (exchange_bound, "80mbit")):
        ms = _row_ms(result, "cpsgd", rate)
        assert _cells(table, "cpsgd") == ["%.1f (%.2f)" % (ms, result["compute_ms"] / ms)]


def _trace_event(name, pid, start_ms, dur_ms, scale):
    """One complete event as cpsgd-bench's merged trace holds it (dilated microseconds)."""
    return {"ph": "X", "name": name, "pid": pid, "tid": 0,
            "ts": start_ms * scale * 1e3, "dur": dur_ms * scale * 1e3}


def test_exchange_window_script_reads_pushes_and_pulls_of_a_trace(tmp_path):
    """reports/perf/exchange_window.py against the same figures computed here from a
    synthetic two-worker trace (three compressed keys per iteration, two iterations)."""
    scale = 10.0
    rng = np.random.RandomState(3)
    events, expected = [], {"window": [], "first_ack": [], "last_ack": [], "tail": []}
    starts = {}
    for pid in (0, 1):
        for it in range(2):
            start = 300.0 * it + 7.0 * pid
            starts.setdefault(it, []).append(start)
            issues = start + np.array([0.0, 4.0, 8.0])
            answers = rng.uniform(1.0, 40.0, size=3)
            pulls = rng.uniform(0.5, 30.0, size=3)
            for t, a, p in zip(issues, answers, pulls):
                events.append(_trace_event("KVStoreDistCompressedPush", pid, t, a, scale))
                events.append(_trace_event("KVStoreDistDefaultStoragePull", pid, t + a, p,
                                           scale))
            events.append(_trace_event("emulated_backward", pid, start, 5.0, scale))
            done = np.max(issues + answers + pulls)
            expected["window"].append(done - start)
            expected["first_ack"].append(answers[0])
            expected["last_ack"].append(np.max(issues + answers) - issues[-1])
            expected["tail"].append(done - np.max(issues + answers))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    script = os.path.join(PERF, "exchange_window.py")
    spec = importlib.util.spec_from_file_location("exchange_window", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.iterations(str(path), scale)
    assert len(rows) == 4
    for key, values in expected.items():
        np.testing.assert_allclose(sorted(r[key] for r in rows), sorted(values), atol=1e-6)
    spreads = module.start_spreads(rows)
    np.testing.assert_allclose(spreads, [max(s) - min(s) for s in starts.values()], atol=1e-6)
    printed = subprocess.run([sys.executable, script, str(path), str(scale)],
                             stdout=subprocess.PIPE, universal_newlines=True, timeout=60,
                             check=True).stdout
    assert "| exchange window: first push issued to last pull done | %.1f | %.1f | %.1f |" % (
        min(expected["window"]), float(np.median(expected["window"])),
        max(expected["window"])) in printed


def test_steady_rate_script_counts_whole_periods_after_the_first_gap(tmp_path):
    """reports/perf/steady_rate.py on a synthetic results directory (a cpsgd run with
    period 5 and a Horovod run, 3 workers, 22 timed iterations, dilated x10): the
    steady rate against numpy on the same gaps, the bench's figure passed through."""
    scale, rng = 10.0, np.random.RandomState(5)
    gaps = {"cp": rng.uniform(80.0, 140.0, size=(3, 22)),
            "horovod": rng.uniform(120.0, 130.0, size=(3, 22))}
    rows = []
    for label, store, drained in (("cp", "cpsgd", 117.0), ("horovod", "horovod", 126.0)):
        run = tmp_path / "runs" / ("90mbit-%s" % label)
        run.mkdir(parents=True)
        for w, times in enumerate(gaps[label]):
            (run / ("worker-%d.json" % w)).write_text(json.dumps(
                {"rank": w, "iter_times_s": list(times * scale / 1000.0), "cpu_s": 1.0}))
        rows.append({"rate": "90mbit", "algorithm": label, "store": store, "failure": None,
                     "mean_ms": drained, "time_scale": scale, "transfer_bound_ms": 104.0})
    rows.append({"rate": "none", "algorithm": "compute", "store": "ssgd", "failure": None})
    (tmp_path / "results.json").write_text(json.dumps({"rows": rows, "config": {
        "emulate_compute": 100.0, "correction_period": 5, "time_scale": scale,
        "warmup_iters": 10,
        "variants": [{"label": "cp", "store": "cpsgd", "knobs": {}},
                     {"label": "horovod", "store": "horovod", "knobs": {}}]}}))
    script = os.path.join(PERF, "steady_rate.py")
    spec = importlib.util.spec_from_file_location("steady_rate", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    got = {r["algorithm"]: r for r in module.rows(str(tmp_path))}
    assert sorted(got) == ["cp", "horovod"]
    cp, horovod = gaps["cp"][:, 1:21].mean(), gaps["horovod"][:, 1:22].mean()
    assert got["cp"]["used"] == 20 and got["horovod"]["used"] == 21
    np.testing.assert_allclose([got["cp"]["steady"], got["horovod"]["steady"]], [cp, horovod])
    np.testing.assert_allclose(got["cp"]["vs_horovod"], cp / horovod)
    printed = subprocess.run([sys.executable, script, str(tmp_path)], stdout=subprocess.PIPE,
                             universal_newlines=True, timeout=60, check=True).stdout
    assert "| 90mbit | cp | 117.0 | %.1f (20) | %.3f | %.3f | %.2f |" % (
        cp, 117.0 / 104.0, cp / 104.0, cp / horovod) in printed
    # the copy kept beside the reports: results.json and the iteration times alone
    kept = tmp_path / "kept"
    kept.mkdir()
    subprocess.run([sys.executable, script, "--keep-iterations", str(tmp_path),
                    str(kept / "n3-iterations.json")], timeout=60, check=True)
    shutil.copy(tmp_path / "results.json", kept / "n3-results.json")
    assert module.rows(str(kept / "n3-results.json")) == module.rows(str(tmp_path))
    saved = json.loads((kept / "n3-iterations.json").read_text())
    assert (saved["time_scale"], saved["warmup_iters"]) == (scale, 10)
    assert sorted(saved["runs"]["90mbit-cp"][0]) == sorted(module.KEPT_FIELDS)


def test_tcp_sampler_lines_samples_up_with_iterations(tmp_path):
    """reports/perf/tcp_sampler.py --stalls on a synthetic run (2 workers, 4 timed
    iterations, dilated x10, one slow iteration) and samples at known times: each
    iteration gets the samples between its first start and last end, the deepest
    backoff among them, the most unread bytes and the zero-window probes pending (shown
    as '-' for samples from before those were recorded)."""
    scale, start = 10.0, 1000.0
    times = np.array([[1.0, 1.0, 3.0, 1.0], [1.1, 0.9, 3.2, 0.8]])  # seconds, dilated
    run = tmp_path / "runs" / "90mbit-cpsgd"
    run.mkdir(parents=True)
    for w, t in enumerate(times):
        (run / ("worker-%d.json" % w)).write_text(json.dumps(
            {"rank": w, "iter_times_s": list(t), "window_start_unix": start}))
    socket = {"local": 40000, "remote": 9000, "cwnd": 1}
    samples = []
    for n, t in enumerate(np.arange(start + 0.05, start + 6.0, 0.25)):
        deep = 3 if 2.5 < t - start < 4.5 else 1  # the slow iteration: 3 RTOs in a row
        # acknowledgements move the unacked bytes, except while the slow one holds
        unacked = 5000 if deep == 3 else 100 + n
        # while the slow one holds, its peer also leaves 700 bytes unread and a second
        # socket waits on a zero-window probe
        probing = [dict(socket, local=40001, rtos=0, rto_ms=200.0, unacked=0, unread=0,
                        timer=4)] if deep == 3 else []
        samples.append({"t": float(t), "hosts": {"net:[1]": [
            dict(socket, rtos=deep, rto_ms=200.0 * 2 ** deep, unacked=unacked,
                 unread=700 if deep == 3 else 0, timer=1)] + probing}})
    held = [s["t"] for s in samples if s["hosts"]["net:[1]"][0]["unacked"] == 5000]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    script = os.path.join(PERF, "tcp_sampler.py")
    printed = subprocess.run([sys.executable, script, "--stalls", str(path), str(run),
                              "--time-scale", str(scale), "--min-ms", "250"],
                             stdout=subprocess.PIPE, universal_newlines=True, timeout=60,
                             check=True).stdout
    ends = np.cumsum(times, axis=1)
    starts = ends - times
    for i in range(4):
        lo, hi = start + starts[:, i].min(), start + ends[:, i].max()
        inside = [s for s in samples if lo <= s["t"] <= hi]
        most = max(s["hosts"]["net:[1]"][0]["rtos"] for s in inside)
        slow = 1e3 * times[:, i].max() / scale
        mark = " (stall)" if slow >= 250 else ""
        deepest = max(inside, key=lambda s: s["hosts"]["net:[1]"][0]["rtos"])
        probes = max(len(s["hosts"]["net:[1]"]) - 1 for s in inside)
        hold = "-"
        if held[0] <= hi and held[-1] >= lo:
            hold = "%.2f, %+.2f" % (held[-1] - held[0], held[-1] - (start + ends[:, i].min()))
        assert "| %d%s | %.1f | %d | 1 | %d | 40000 > 9000, %.0f, %d, 1 | %s | %s | %d |" % (
            i, mark, slow, len(inside), most, 200.0 * 2 ** most,
            deepest["hosts"]["net:[1]"][0]["unacked"], hold,
            "700 (40000 > 9000)" if probes else "0", probes) in printed, printed
    packed = tmp_path / "samples.jsonl.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert subprocess.run([sys.executable, script, "--stalls", str(packed), str(run),
                           "--time-scale", str(scale), "--min-ms", "250"],
                          stdout=subprocess.PIPE, universal_newlines=True, timeout=60,
                          check=True).stdout == printed
    assert printed.count(" | -") == sum(  # iterations the hold does not reach
        1 for i in range(4) if not (held[0] <= start + ends[:, i].max()
                                    and held[-1] >= start + starts[:, i].min()))
    for s in samples:  # as written before unread bytes and probes were recorded
        s["hosts"]["net:[1]"] = [{k: v for k, v in k.items() if k not in ("unread", "timer")}
                                 for k in s["hosts"]["net:[1]"]]
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    older = subprocess.run([sys.executable, script, "--stalls", str(path), str(run),
                            "--time-scale", str(scale), "--min-ms", "250"],
                           stdout=subprocess.PIPE, universal_newlines=True, timeout=60,
                           check=True).stdout
    rows = [line for line in older.splitlines()
            if line.startswith("| ") and not line.startswith("|---")][1:]
    assert len(rows) == 4 and all(r.endswith("| - | - |") for r in rows), older


def test_late_keys_script_names_the_keys_acknowledged_last(tmp_path):
    """reports/perf/late_keys.py on a synthetic trace (3 workers, two rounds of 4 dense
    pushes): per round, the keys acknowledged last with their start and acknowledgement
    times (first and last worker) and the count within the median + one period."""
    scale, period = 10.0, 100.0
    rng = np.random.RandomState(5)
    events, rounds = [], []
    for n in range(2):
        base = 1000.0 * n
        starts = base + rng.uniform(0.0, 30.0, size=(3, 4)).cumsum(axis=1)  # worker, key
        late = 1 + n  # this round's late key: acknowledged 250 ms after, on every worker
        acks = starts.max(axis=0) + rng.uniform(5.0, 20.0, size=4)
        acks[late] += 250.0
        ends = np.tile(acks, (3, 1)) + rng.uniform(0.0, 2.0, size=(3, 4))
        for pid in range(3):
            for j in range(4):
                events.append(_trace_event("KVStoreDistDefaultPush", pid, starts[pid, j],
                                           ends[pid, j] - starts[pid, j], scale))
        rounds.append((starts - starts.min(), ends - starts.min(), late))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    printed = subprocess.run([sys.executable, os.path.join(PERF, "late_keys.py"), str(path),
                              "--time-scale", str(scale), "--keys-per-round", "4",
                              "--show", "1", "--period-ms", str(period)],
                             stdout=subprocess.PIPE, universal_newlines=True, timeout=60,
                             check=True).stdout
    for n, (starts, ends, late) in enumerate(rounds):
        last = ends.max(axis=0)
        within = int(np.sum(last <= np.median(last) + period))
        assert within == 3
        assert ("round %d: 4 keys x 3 workers; last acknowledgement %.1f ms after the first "
                "push started, median key %.1f; %d of 4 keys acknowledged within the median "
                "+ %.0f ms" % (n, last.max(), np.median(last), within, period)) in printed
        assert "| %d | %.1f, %.1f | %.1f, %.1f | %.1f |" % (
            late, starts[:, late].min(), starts[:, late].max(), ends[:, late].min(),
            last[late], last[late] - ends[:, late].min()) in printed, printed


def test_late_keys_script_names_the_socket_that_held(tmp_path):
    """late_keys.py --samples: within a round's late stretch (median key's
    acknowledgement to the last), the socket whose unacknowledged bytes stayed the same
    longest comes first, with its hold in seconds real; one whose bytes move never does."""
    scale = 10.0
    start_s = 1000.0  # wall clock of the round's first push, seconds
    events = []
    acks = [20.0, 30.0, 40.0, 300.0]  # dilated ms after the first push; key 3 is late
    for pid in range(2):
        for j, ack in enumerate(acks):
            begin = start_s * 1e3 / scale + j  # dilated ms, as _trace_event takes them
            events.append(_trace_event("KVStoreDistDefaultPush", pid, begin,
                                       start_s * 1e3 / scale + ack - begin, scale))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    median_end = start_s + np.median(acks) * scale / 1e3
    last_end = start_s + max(acks) * scale / 1e3
    times = np.arange(start_s, last_end + 0.5, 0.25)
    samples = []
    for n, t in enumerate(times):
        held = 5000 if median_end + 0.3 <= t <= last_end - 0.2 else 100 + n
        sockets = [{"local": 40000, "remote": 9000, "unacked": held, "rtos": 0, "cwnd": 4},
                   {"local": 40001, "remote": 9001, "unacked": 200 + n, "rtos": 0, "cwnd": 9}]
        if n % 3 == 0:  # the same bytes, but acknowledged in between: never a hold
            sockets.append({"local": 40002, "remote": 9002, "unacked": 21, "rtos": 0,
                            "cwnd": 9})
        samples.append({"t": float(t), "hosts": {"net:[1]": sockets}})
    spath = tmp_path / "samples.jsonl"
    spath.write_text("".join(json.dumps(s) + "\n" for s in samples))
    printed = subprocess.run([sys.executable, os.path.join(PERF, "late_keys.py"), str(path),
                              "--time-scale", str(scale), "--keys-per-round", "4",
                              "--samples", str(spath)],
                             stdout=subprocess.PIPE, universal_newlines=True, timeout=60,
                             check=True).stdout
    inside = [t for t in times if median_end + 0.3 <= t <= last_end - 0.2]
    assert "- host net:[1], 40000 > 9000, held %.2f s:" % (inside[-1] - inside[0]) in printed, \
        printed
    assert "40001 > 9001" not in printed
    assert "40002 > 9002" not in printed
