"""Results of the fault campaign (:mod:`.faults`): ``faults-campaign.json``
(every fault and every configuration as measured, plus a summary) and
``faults-campaign.md`` (the same as tables)."""
import json
import os
import statistics
import time
from typing import Dict, List, Optional

JSON = "faults-campaign.json"
MARKDOWN = "faults-campaign.md"


def _median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def summarize(configs: List[Dict]) -> Dict:
    """Counts, medians and maxima over every injected fault of every configuration."""
    # (engine, fault) of every injected fault
    injected = [(c["where"], f) for c in configs for f in c["faults"]
                if f["injected_s"] is not None]
    faults = [f for _, f in injected]
    recovered = [f for f in faults if f["recovered"]]
    times = [f["fault_to_training_s"] for f in recovered]
    detected = [f["detected_s"] - f["injected_s"] for f in recovered if f["detected_s"] is not None]
    after_restart = [f["training_again_s"] - f["detected_s"] for f in recovered
                     if f["detected_s"] is not None]
    steps = [f["steps_recomputed"] for f in recovered]
    per_kind = {}
    for kind in sorted({f["kind"] for f in faults}):
        mine = [f for f in faults if f["kind"] == kind]
        ok = [f for f in mine if f["recovered"]]
        per_kind[kind] = {
            "injected": len(mine), "recovered": len(ok),
            "fault_to_training_median_s": _median([f["fault_to_training_s"] for f in ok]),
            "fault_to_training_max_s": max([f["fault_to_training_s"] for f in ok], default=None),
            "steps_recomputed_median": _median([f["steps_recomputed"] for f in ok])}
    per_engine_kind = {}
    for engine, kind in sorted({(where, f["kind"]) for where, f in injected}):
        mine = [f for where, f in injected if where == engine and f["kind"] == kind]
        ok = [f["fault_to_training_s"] for f in mine if f["recovered"]]
        per_engine_kind["%s %s" % (engine, kind)] = {
            "engine": engine, "kind": kind, "injected": len(mine),
            "recovered_by_restart": sum(1 for f in mine if f["recovered"]
                                        and f["restart"] is not None),
            "survived_without_restart": sum(1 for f in mine if f["recovered"]
                                            and f["restart"] is None),
            "not_recovered": sum(1 for f in mine if not f["recovered"]),
            "fault_to_training_median_s": _median(ok),
            "fault_to_training_max_s": max(ok, default=None)}
    jobs_ok = [c for c in configs if c["exit_code"] == 0
               and all(f["recovered"] for f in c["faults"] if f["injected_s"] is not None)]
    return {
        "faults_injected": len(faults),
        "faults_recovered": len(recovered),
        "recovered_without_restart": sum(1 for f in recovered if f["restart"] is None),
        "faults_not_injected": sum(1 for c in configs for f in c["faults"]
                                   if f["injected_s"] is None),
        "jobs": len(configs),
        "jobs_recovered": len(jobs_ok),
        "fault_to_training_median_s": _median(times),
        "fault_to_training_max_s": max(times, default=None),
        "fault_to_restart_median_s": _median(detected),
        "fault_to_restart_max_s": max(detected, default=None),
        "restart_to_training_median_s": _median(after_restart),
        "restart_to_training_max_s": max(after_restart, default=None),
        "steps_recomputed_total": sum(steps),
        "steps_recomputed_median": _median(steps),
        "steps_recomputed_max": max(steps, default=None),
        "per_kind": per_kind,
        "per_engine_kind": per_engine_kind,
    }


def _fmt(value, digits=1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "%.*f" % (digits, value)
    return str(value)


def _setting(value) -> str:
    """A setting's value; a list of lists (merged campaigns) as a / b."""
    if isinstance(value, list):
        return (" / " if any(isinstance(v, list) for v in value) else ",").join(
            _setting(v) for v in value)
    return str(value)


def _comparison_rows(config: Dict) -> List[str]:
    rows = []
    for name, cmp in sorted(config["comparison"].items()):
        if not cmp.get("same_names"):
            rows.append("| %s | %s | different parameter names | | | |" % (config["config"], name))
            continue
        rows.append("| %s | %s | %s | %s | %s | %s |" % (
            config["config"], name, "yes" if cmp["bit_identical"] else "no",
            "%.3g" % cmp["max_abs_diff"], "%.3g" % cmp["rel_l2"],
            _fmt(config["val_acc"].get(name.split("_vs_")[0]), 4)))
    return rows


def markdown(configs: List[Dict], settings: Dict, summary: Dict, started: float,
             ended: float) -> str:
    lines = ["# Fault campaign: results", "",
             "Written by `python -m mxnet_cpsgd.bench.faults` (%s to %s UTC)." % (
                 time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
                 time.strftime("%H:%M", time.gmtime(ended))),
             "Settings: %s." % ", ".join("%s=%s" % (k, _setting(v))
                                        for k, v in sorted(settings.items())), "",
             "## Summary", "",
             "| faults injected | recovered | jobs recovered | fault to training again, "
             "median / max | steps recomputed, total / median / max |",
             "|---|---|---|---|---|",
             "| %d | %d | %d of %d | %s s / %s s | %s / %s / %s |" % (
                 summary["faults_injected"], summary["faults_recovered"],
                 summary["jobs_recovered"], summary["jobs"],
                 _fmt(summary["fault_to_training_median_s"]),
                 _fmt(summary["fault_to_training_max_s"]), summary["steps_recomputed_total"],
                 _fmt(summary["steps_recomputed_median"]), _fmt(summary["steps_recomputed_max"])),
             ""]
    lines += ["Fault to the launcher's restart line (detection and teardown): median %s s, "
              "max %s s; restart line to training again (start, resume): median %s s, "
              "max %s s." % (_fmt(summary["fault_to_restart_median_s"]),
                             _fmt(summary["fault_to_restart_max_s"]),
                             _fmt(summary["restart_to_training_median_s"]),
                             _fmt(summary["restart_to_training_max_s"])), ""]
    if summary["recovered_without_restart"]:
        lines += ["Recovered without a restart (the job went on when the link came back, "
                  "or without the killed slurmd): %d." % summary["recovered_without_restart"],
                  ""]
    if summary["faults_not_injected"]:
        lines += ["Faults planned but not injected: %d (see the rows)." %
                  summary["faults_not_injected"], ""]
    lines += ["Per kind:", "", "| kind | injected | recovered | fault to training, median / "
              "max (s) | steps recomputed, median |", "|---|---|---|---|---|"]
    for kind, row in summary["per_kind"].items():
        lines.append("| %s | %d | %d | %s / %s | %s |" % (
            kind, row["injected"], row["recovered"], _fmt(row["fault_to_training_median_s"]),
            _fmt(row["fault_to_training_max_s"]), _fmt(row["steps_recomputed_median"])))
    if len({row["engine"] for row in summary["per_engine_kind"].values()}) > 1:
        lines += ["", "Per engine and kind:", "",
                  "| engine | kind | injected | recovered by a restart | survived without "
                  "a restart | not recovered | fault to training, median / max (s) |",
                  "|---|---|---|---|---|---|---|"]
        for row in summary["per_engine_kind"].values():
            lines.append("| %s | %s | %d | %d | %d | %d | %s / %s |" % (
                row["engine"], row["kind"], row["injected"], row["recovered_by_restart"],
                row["survived_without_restart"], row["not_recovered"],
                _fmt(row["fault_to_training_median_s"]),
                _fmt(row["fault_to_training_max_s"])))
    if "namespaces_left" in summary:
        lines += ["", "Network namespaces of the campaign left after its teardown: %s." % (
            ", ".join(summary["namespaces_left"]) or "none")]
    lines += ["", "## Jobs", "",
              "| config | faulted run exit | restarts | faulted run (s) | reference run (s) | "
              "final iterations (faulted / reference) | val acc (faulted / reference) | "
              "leftovers |", "|---|---|---|---|---|---|---|---|"]
    for c in configs:
        lines.append("| %s | %s | %d | %s | %s | %s / %s | %s / %s | %s |" % (
            c["config"], c["exit_code"], c["restarts"], _fmt(c["faulted_seconds"], 0),
            _fmt(c["reference_seconds"], 0), c["final_iterations"].get("faulted"),
            c["final_iterations"].get("reference"), _fmt(c["val_acc"].get("faulted"), 4),
            _fmt(c["val_acc"].get("reference"), 4), "; ".join(c["leftovers"]) or "none"))
    lines += ["", "## Final weights against the uninterrupted reference run (same seed)", "",
              "| config | run | bit-identical | max abs diff | relative L2 | val acc |",
              "|---|---|---|---|---|---|"]
    for c in configs:
        lines += _comparison_rows(c)
    lines += ["", "## Every fault", "",
              "| config | # | kind | target | injected (s) | iteration | restart | resumed "
              "from | last iteration before restart | restart line (s after fault) | fault to "
              "training (s) | steps recomputed | recovered |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in configs:
        for f in c["faults"]:
            detected = None if f["detected_s"] is None or f["injected_s"] is None \
                else f["detected_s"] - f["injected_s"]
            lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                c["config"], f["index"], f["kind"], f["target"] or "-",
                _fmt(f["injected_s"]), _fmt(f["iteration_at_fault"]), _fmt(f["restart"]),
                _fmt(f["resumed_from"]), _fmt(f["last_iteration_before_restart"]),
                _fmt(detected),
                _fmt(f["fault_to_training_s"]), _fmt(f["steps_recomputed"]),
                ("yes" if f["recovered"] else "no") + (" (%s)" % f["note"] if f["note"] else "")))
    return "\n".join(lines) + "\n"


def write(out: str, configs: List[Dict], settings: Dict, started: float,
          ended: float, namespaces_left: Optional[List[str]] = None) -> Dict:
    """Write both files into ``out``; returns the summary.  ``namespaces_left``:
    what the campaign's teardown left (None: not checked yet)."""
    summary = summarize(configs)
    if namespaces_left is not None:
        summary["namespaces_left"] = namespaces_left
    settings = {k: v for k, v in settings.items() if k != "out"}
    with open(os.path.join(out, JSON), "w") as f:
        json.dump({"settings": settings, "started": started, "ended": ended,
                   "summary": summary, "configs": configs}, f, indent=1, sort_keys=True)
    with open(os.path.join(out, MARKDOWN), "w") as f:
        f.write(markdown(configs, settings, summary, started, ended))
    return summary


def rewrite(out: str) -> Dict:
    """Write ``faults-campaign.md`` again from ``faults-campaign.json`` in ``out``
    (and the JSON's summary); returns the summary."""
    with open(os.path.join(out, JSON)) as f:
        data = json.load(f)
    return write(out, data["configs"], data["settings"], data["started"], data["ended"],
                 data["summary"].get("namespaces_left"))


def merge(out: str, parts: List[str]) -> Dict:
    """One report in ``out`` from the campaigns written into ``parts`` (say,
    one per engine, run side by side): their configurations in order, their
    settings where they agree (a list of each part's value where not), the
    earliest start and the latest end; returns the summary."""
    data = []
    for part in parts:
        with open(os.path.join(part, JSON)) as f:
            data.append(json.load(f))
    settings: Dict = {}
    for key in sorted({k for d in data for k in d["settings"]}):
        values = [d["settings"].get(key) for d in data]
        same = all(v == values[0] for v in values)
        settings[key] = values[0] if same else values
    left = [n for d in data for n in d["summary"].get("namespaces_left", [])]
    os.makedirs(out, exist_ok=True)
    return write(out, [c for d in data for c in d["configs"]], settings,
                 min(d["started"] for d in data), max(d["ended"] for d in data), left)


if __name__ == "__main__":
    # python -m mxnet_cpsgd.bench.fault_report DIR: write DIR's markdown again;
    # ... --merge OUT DIR1 DIR2 ...: one report of several campaigns
    import sys
    if sys.argv[1] == "--merge":
        merge(sys.argv[2], sys.argv[3:])
    else:
        rewrite(sys.argv[1])
