#!/bin/bash
# scaleplan's GPU paths in one call on a lent one-GPU machine (no network there), from the repo root:
#   bash benchmarks/gpu_check.sh gpu    # there: python3 with torch; dependency wheels in $WHL (.whl)
#   bash benchmarks/gpu_check.sh cpu    # here: a dry run of the same steps on the tiny spec
# Steps, most important first, each under its own timeout so one hang still returns the rest:
#  1. the recorded tables (cluster_profiles/recorded) imported into a fresh SQLite database;
#  2. validate the reference MoE (4 layouts) with --bench: measured vs predicted step time and memory;
#     then one layout again with --trace: each traced step's device time read twice (attribution vs the
#     saved trace);
#  3. bench preset single-gpu-holdout: dispatch sync:<every>, SDPA at 32k tokens, grouped GEMM at
#     4096/8192 tokens per expert; 4. bench check; 5. export the measured runs as CSV.
# Results under $OUT (at most 8 files): log (tee it), validate.json, validate_trace.json, sp.db, rec.tar.gz. Env: OUT, W (work
# folder), PY, WHL (dependency wheels), SP_WHEEL (scaleplan wheel of this commit; default: build the checkout).
set -x
export PYTHONUNBUFFERED=1
MODE=${1:-gpu}
REPO=$(pwd)
OUT=${OUT:-/tmp/gpu-check-out}
W=${W:-/tmp/spw}
SITE=$W/site
if [ "$MODE" = gpu ]; then
  PY=${PY:-python3}; WHL=${WHL:-$REPO/.whl}; DEV=cuda; PROF="--profile h200-single"
  SPEC=$REPO/tests/data/validate_specs/gpu_small.yaml
  LAYS="--layout mbs=1,ckpt=none --layout mbs=2,ckpt=none --layout mbs=4,ckpt=none --layout mbs=2,ckpt=full"
  TRACE_LAY="--layout mbs=2,ckpt=none"
  T_VAL=140; T_TR=90; T_SYNC=40; T_SDPA=50; T_GG=90; T_CHK=30
else  # deps from $PY's own environment; sync rows are UNSUPPORTED on a CPU, the big points skipped
  PY=${PY:-python3}; WHL=; DEV=cpu; PROF=""
  SPEC=$REPO/tests/data/validate_specs/tiny.yaml
  LAYS="--layout mbs=1,ckpt=none"; TRACE_LAY=$LAYS
  T_VAL=400; T_TR=100; T_SYNC=30; T_SDPA=10; T_GG=10; T_CHK=60
fi
rm -rf "$W"; mkdir -p "$OUT" "$W/rec" "$W/extra"
export SCALEPLAN_DB=sqlite:///$W/sp.db SCALEPLAN_CACHE=$W/cache
WHEELS=$( [ -n "$WHL" ] && ls "$WHL"/*.whl | grep -v '/scaleplan-' )
# scaleplan: $SP_WHEEL (a wheel of this checkout's commit, built beforehand), else this checkout built there
timeout 120 $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
  --target "$SITE" $WHEELS "${SP_WHEEL:-$REPO}" || exit 3
export PYTHONPATH=$SITE
SP=$SITE/bin/scaleplan
cd "$W" || exit 4   # not the repo root: its scaleplan/ folder would shadow the installed package
date -u
timeout 15 nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.sm,clocks.mem --format=csv
timeout 30 $PY -c "import sys, torch, scaleplan.estimator; print(sys.version.split()[0], torch.__version__, \
torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0), scaleplan.estimator.__file__)"
save_db() { timeout 20 $PY -c "import sqlite3; s = sqlite3.connect('$W/sp.db'); d = sqlite3.connect('$OUT/sp.db'); \
s.backup(d); d.close()"; }
timeout 60 $SP db import-recorded | tail -3
timeout -s INT $T_VAL $SP validate "$SPEC" --device $DEV $LAYS --bench --sweep validate-s3 --steps 5 --warmup 2 \
  --json > "$OUT/validate.json"
echo "validate rc=$?"; date -u; save_db
# one layout traced (a trace of 2 steps is large: one layout bounds the time), on the tables just measured
timeout -s INT $T_TR $SP validate "$SPEC" --device $DEV $TRACE_LAY --trace "$W/trace" --no-store --steps 3 \
  --warmup 2 --json > "$OUT/validate_trace.json"
echo "validate trace rc=$?"; date -u; du -sh "$W/trace"
timeout 30 $PY - "$OUT/validate.json" "$OUT/validate_trace.json" <<'EOF'
import json, sys
rows = []
for f in sys.argv[1:]:
    try:
        rows += json.load(open(f))
    except Exception as e:
        print(f, "unreadable:", e)
g = lambda x: float("nan") if x is None else x
for r in rows:
    lay, c = r["layout"], r.get("components") or {}
    t = c.get("in_trace") or {}
    print(f"mbs={lay['mbs']} ckpt={lay['ckpt']}: step meas {g(r['measured_t_iter_s']):.4f} s pred "
          f"{g(r['predicted_t_iter_s']):.4f} s; mem alloc meas {g(r['measured_peak_mem_gb']):.3f} GB pred "
          f"{g(r['predicted_mem_gb']):.3f} GB; reserved meas {g(r.get('measured_mem_reserved_gb')):.3f} pred "
          f"{g(r.get('predicted_mem_reserved_gb')):.3f}")
    if c:
        print(f"  traced step {c['step_wall_s']:.4f} s: kernels {t.get('kernels')} launches {t.get('launches')} "
              f"device {t.get('device_s')} busy {t.get('busy_s')} attributed {c['attributed_device_s']:.4f}")
        print("  " + ", ".join(f"{x['component']} {x['measured_s']:.4f}/{x['predicted_s'] or 0:.4f}" for x in c["rows"]))
EOF
for s in dispatch:$T_SYNC sdpa:$T_SDPA grouped_gemm:$T_GG; do
  timeout -s INT ${s#*:} $SP bench run --preset single-gpu-holdout --suite ${s%:*} $PROF --json \
    > "$W/extra/bench_${s%:*}.json"
  echo "bench ${s%:*} rc=$?"; date -u; save_db
done
timeout -s INT $T_CHK $SP bench check --json > "$W/extra/check.json"; echo "check rc=$?"; cat "$W/extra/check.json"
timeout 30 $SP bench runs --json > "$W/extra/runs.json"
IDS=$($PY -c "import json; print(' '.join(str(r['id']) for r in json.load(open('$W/extra/runs.json'))['runs'] \
if r['source'] == 'measured'))")
timeout 30 $SP bench export $IDS --out "$W/rec"
save_db
tar czf "$OUT/rec.tar.gz" -C "$W" extra rec
ls -la "$OUT"; date -u
