#!/bin/bash
# scaleplan's GPU paths in one call on a lent one-GPU machine (no network there), from the repo root:
#   bash benchmarks/gpu_check.sh gpu    # there: python3 with torch; dependency wheels in $WHL (.whl)
#   bash benchmarks/gpu_check.sh cpu    # here: a dry run of the same steps on the tiny spec
# Env: PROFILE (default h200-single; h100-single on an H100), F8_PRESET (the fp8 step's preset), STEPS (default "validate trace holdout check";
# a GPU without tables of its own starts with "tables"), HOLDOUT (suites of the holdout preset, default
# "dispatch sdpa grouped_gemm"), OUT, W (work folder), PY, WHL (dependency wheels), SP_WHEEL (scaleplan
# wheel of this commit; default: build the checkout), SCALEPLAN_GIT_REV (the commit, where the copy has no .git).
# Steps, each under its own timeout so one hang still returns the rest (the database is saved after each):
#  0. the recorded tables (cluster_profiles/recorded) imported into a fresh SQLite database (always);
#  tables:   bench preset single-gpu, every single-GPU suite (the largest last: a timeout cuts it, not the rest);
#  validate: the reference MoE (4 layouts) with --bench: measured vs predicted step time and memory;
#  trace:    one layout again with --trace: each traced step's device time read twice (attribution vs trace);
#  check:    bench check (the harness against a plain torch.matmul loop);
#  holdout:  bench preset single-gpu-holdout, one suite at a time (dispatch sync:<every>, SDPA at 32k tokens,
#            grouped GEMM at 4096/8192 tokens per expert);
#  fp8:      bench preset single-gpu-fp8, one suite at a time (F8_SUITES, default: FP8 casts, dense FP8 GEMMs
#            beside bf16, the FP8 expert projection beside bf16), then the paired FP8 / bf16 ratios printed;
#  then (always) export the measured runs as CSV.
# Results under $OUT (at most 8 files): log (tee it), validate.json, validate_trace.json, sp.db, rec.tar.gz.
set -x
export PYTHONUNBUFFERED=1
MODE=${1:-gpu}
REPO=$(pwd)
OUT=${OUT:-/tmp/gpu-check-out}
W=${W:-/tmp/spw}
SITE=$W/site
if [ "$MODE" = gpu ]; then
  PY=${PY:-python3}; WHL=${WHL:-$REPO/.whl}; DEV=cuda; PROF="--profile ${PROFILE:-h200-single}"
  SPEC=$REPO/tests/data/validate_specs/gpu_small.yaml
  LAYS="--layout mbs=1,ckpt=none --layout mbs=2,ckpt=none --layout mbs=4,ckpt=none --layout mbs=2,ckpt=full"
  TRACE_LAY="--layout mbs=2,ckpt=none"
  T_TAB=170; T_VAL=140; T_TR=90; T_SYNC=40; T_SDPA=50; T_GG=90; T_CHK=30; TAB_PRESET=single-gpu
  T_F8E=90; T_F8G=100; T_F8X=200; F8_PRESET=${F8_PRESET:-single-gpu-fp8}
else  # deps from $PY's own environment; sync rows are UNSUPPORTED on a CPU, the big points skipped
  PY=${PY:-python3}; WHL=; DEV=cpu; PROF=""
  SPEC=$REPO/tests/data/validate_specs/tiny.yaml
  LAYS="--layout mbs=1,ckpt=none"; TRACE_LAY=$LAYS
  T_TAB=120; T_VAL=400; T_TR=100; T_SYNC=30; T_SDPA=10; T_GG=10; T_CHK=60; TAB_PRESET=quick
  T_F8E=20; T_F8G=20; T_F8X=20; F8_PRESET=${F8_PRESET:-single-gpu-fp8}
fi
STEPS=" ${STEPS:-validate trace holdout check} "
SWEEP=${SWEEP:-validate-${PROFILE:-s3}}
has() { [[ "$STEPS" == *" $1 "* ]]; }
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
if has tables; then
  timeout -s INT $T_TAB $SP bench run --preset $TAB_PRESET $PROF --json \
    --suite dispatch,allocator,vocab,elementwise,router,sdpa,gemm,grouped_gemm > "$W/extra/bench_tables.json"
  echo "bench tables rc=$?"; date -u; save_db
fi
if has validate; then
  timeout -s INT $T_VAL $SP validate "$SPEC" --device $DEV $LAYS --bench --sweep "$SWEEP" --steps 5 --warmup 2 \
    --json > "$OUT/validate.json"
  echo "validate rc=$?"; date -u; save_db
fi
if has trace; then
  # one layout traced (a trace of 2 steps is large: one layout bounds the time), on the tables just measured
  timeout -s INT $T_TR $SP validate "$SPEC" --device $DEV $TRACE_LAY --trace "$W/trace" --no-store --steps 3 \
    --warmup 2 --json > "$OUT/validate_trace.json"
  echo "validate trace rc=$?"; date -u; du -sh "$W/trace"
fi
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
if has check; then
  timeout -s INT $T_CHK $SP bench check --json > "$W/extra/check.json"; echo "check rc=$?"; cat "$W/extra/check.json"
fi
if has holdout; then
  declare -A T_HOLD=([dispatch]=$T_SYNC [sdpa]=$T_SDPA [grouped_gemm]=$T_GG)
  for h in ${HOLDOUT:-dispatch sdpa grouped_gemm}; do
    timeout -s INT ${T_HOLD[$h]} $SP bench run --preset single-gpu-holdout --suite $h $PROF --json \
      > "$W/extra/bench_$h.json"
    echo "bench $h rc=$?"; date -u; save_db
  done
fi
if has fp8; then
  declare -A T_F8=([elementwise]=$T_F8E [gemm]=$T_F8G [grouped_gemm]=$T_F8X)
  for f in ${F8_SUITES:-elementwise gemm grouped_gemm}; do
    timeout -s INT ${T_F8[$f]} $SP bench run --preset $F8_PRESET --suite $f $PROF --json > "$W/extra/fp8_$f.json"
    echo "bench fp8 $f rc=$?"; date -u; save_db
  done
  timeout 60 $PY "$REPO/benchmarks/fp8_ratios.py" --db "sqlite:///$W/sp.db"
fi
timeout 30 $SP bench runs --json > "$W/extra/runs.json"
IDS=$($PY -c "import json; print(' '.join(str(r['id']) for r in json.load(open('$W/extra/runs.json'))['runs'] \
if r['source'] == 'measured'))")
timeout 30 $SP bench export $IDS --out "$W/rec"
save_db
tar czf "$OUT/rec.tar.gz" -C "$W" extra rec
ls -la "$OUT"; date -u
