#!/usr/bin/env bash
# Regime search: 6 RL steps per config from the cached warm start; median rollout_corr/k3_kl.
cd /work/studies
out=search.tsv
[ -f $out ] || printf "label\toverrides\tmedian_k3\tmean_k3\tmedian_kl\tacc0\tsecs\n" > $out
while IFS='|' read -r label ov; do
  [ -z "$label" ] && continue
  grep -q "^$label	" $out && continue
  t0=$(date +%s)
  log=$(/work/main/.venv/bin/suite run steps=6 eval_every=100 task.n_eval=32 uaq.s=1.0 \
      tracking.tracking_uri=sqlite:////work/studies/search.db out_dir=/work/studies/search $ov 2>&1 | tail -1)
  rid=$(echo "$log" | sed -n 's/^done \([^:]*\):.*/\1/p')
  t1=$(date +%s)
  stats=$(/work/main/.venv/bin/python - "$rid" <<'PY'
import json, sys, statistics as st
rows=[json.loads(l) for l in open(f"search/{sys.argv[1]}/metrics.jsonl")]
k3=[r["metrics"]["rollout_corr/k3_kl"] for r in rows if "rollout_corr/k3_kl" in r["metrics"]]
kl=[r["metrics"]["rollout_corr/kl"] for r in rows if "rollout_corr/kl" in r["metrics"]]
acc=[r["metrics"]["val-core/arith/acc/mean@1"] for r in rows if "val-core/arith/acc/mean@1" in r["metrics"]] or [float('nan')]
print(f"{st.median(k3):.3g}\t{st.mean(k3):.3g}\t{st.median(kl):.3g}\t{acc[0]:.3f}")
PY
)
  printf "%s\t%s\t%s\t%s\n" "$label" "$ov" "$stats" "$((t1-t0))" >> $out
  echo "$label $stats ($((t1-t0)) s)"
done < "${1:-configs.txt}"
