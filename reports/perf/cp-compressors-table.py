"""cp-X against X and horovod from a cpsgd-bench results.json: python reports/perf/cp-compressors-table.py RESULTS_JSON."""
import json, sys
r = json.load(open(sys.argv[1]))
rows = {x['algorithm']: x for x in r['rows']}
h = rows['horovod']
print("| X | X ms/iter (median) | cp-X ms/iter (median) | cp-X / X mean (median) | cp-X / horovod mean (median) | KB/iter busiest link X / cp-X | step() ms X / cp-X |")
print("|---|---:|---:|---:|---:|---:|---:|")
for x in ["signsgd", "topk", "powersgd", "acpsgd", "fp16"]:
    a, b = rows.get(x), rows.get("cpsgd_" + x)
    if not a or not b: continue
    print("| %s | %.1f (%.1f) | %.1f (%.1f) | %.2f (%.2f) | %.2f (%.2f) | %.0f / %.0f | %.1f / %.1f |" % (
        x, a['mean_ms'], a['median_ms'], b['mean_ms'], b['median_ms'],
        b['mean_ms'] / a['mean_ms'], b['median_ms'] / a['median_ms'],
        b['mean_ms'] / h['mean_ms'], b['median_ms'] / h['median_ms'],
        a['max_link_bytes_per_iter'] / 1000, b['max_link_bytes_per_iter'] / 1000,
        a['step_call_ms'], b['step_call_ms']))
for x in ["k5", "cpfold_topk", "BIT"]:
    b = rows.get(x)
    if b: print("| (%s) | | %.1f (%.1f) | | %.2f (%.2f) | %.0f | %.1f |" % (x, b['mean_ms'], b['median_ms'], b['mean_ms']/h['mean_ms'], b['median_ms']/h['median_ms'], b['max_link_bytes_per_iter']/1000, b['step_call_ms']))
print("horovod %.1f (%.1f); compute %.1f; load %s -> %s" % (h['mean_ms'], h['median_ms'], rows['compute']['mean_ms'], r['load_start'], r['load_end']))
