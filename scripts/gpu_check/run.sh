#!/bin/bash
# GPU check (scripts/gpu_check/prepare.sh builds .devpkg): notebook 02 on CUDA (3 groups, a kill,
# identical after the heal), bench_recovery, and bench_heal's heals of a 1.25 GB state GPU to GPU
# (the striped transport's device path: pieces staged through host memory). Python 3.12 + the machine's torch; the rest from .devpkg.
export PYTHONUNBUFFERED=1
R=$PWD; P=$R/.devpkg; S=/tmp/site
mkdir -p $S/bin /tmp/runs
t0=$(date +%s)
( cd $S && tar xJf $P/devsite.tar.xz && tar xJf $P/monarch_rest.tar.xz \
  && xz -dc $P/rb.so.xz > monarch/_rust_bindings.cpython-312-x86_64-linux-gnu.so ) || { echo "unpack failed"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $S $P/*.whl || exit 4
ln -sf "$(command -v python3)" $S/bin/python
cp $P/sitecustomize.py $S/
export PYTHONPATH=$S:$R PATH=$S/bin:$PATH JUPYTER_PATH=$R MONARCH_NB_RUNS=/tmp/runs
echo "== setup $(( $(date +%s) - t0 )) s"
nvidia-smi -L
python3 - <<'PY' 2>&1 | tee $OUT/versions.txt
import time, monarch_nb, torch, torchft, monarch, torchtitan
from monarch_nb.ft import select_platform
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())
print("platform", select_platform().describe())
from monarch_nb.ft import FTRun, RunConfig
try:
    FTRun(RunConfig(replicas=3, run_name=f"nccl-check-{time.time():.0f}")).start()
except ValueError as e:
    print("3 groups + nccl on 1 GPU refused before anything starts:", e)
PY
echo "== probe: one torchtitan step on CUDA in-process"
python3 - <<'PY' 2>&1 | tail -25 || true
import os, time, torch
from monarch_nb import seam
seam.stub_triton_kernels()
from monarch_nb.ft.config import RunConfig
from monarch_nb.ft.replica_trainer import ReplicaTrainer
from monarch_nb.ft.tinydata import ensure_tinydata
cfg = {**RunConfig(replicas=1).to_dict(), "backend": "gloo"}
t = time.time()
tr = ReplicaTrainer(cfg, replica=None, rank=0, group_size=1, lighthouse=None, store_port=None, data_dir=str(ensure_tinydata()), emit=lambda e: None)
print("spare trainer built on", tr.device, "in", round(time.time() - t, 1), "s; params on", next(tr.model.parameters()).device if hasattr(tr, "model") else "?")
PY
# nccl needs a GPU per group (3 groups + 1 spare); with fewer, gloo carries the cross-group collectives
G=$(python3 -c "import torch; print(torch.cuda.device_count())"); [ "$G" -ge 4 ] && FLAGS="" BK="" || FLAGS="--backend gloo" BK="--backend gloo"
echo "== notebook 02 on CUDA, $G GPU(s), train flags: ${FLAGS:-none (nccl)}"
t1=$(date +%s)
timeout 280 python3 -m monarch_nb.cli execute notebooks/02_fault_tolerant_training.ipynb -p replicas=3 \
  -p "train_flags=$FLAGS" --output $OUT/02_cuda.out.ipynb --timeout 250
echo "== notebook 02 rc=$? in $(( $(date +%s) - t1 )) s"
echo "== bench_recovery"
t2=$(date +%s)
timeout 170 python3 bench/bench_recovery.py --kinds kill,comms --repeats 1 --spares 1 $BK --out $OUT/recovery_cuda.json 2>&1 | grep -v "^WARNING\|Future.get"
echo "== bench rc=${PIPESTATUS[0]} in $(( $(date +%s) - t2 )) s"
ls /tmp/runs | head; tar czf $OUT/runs.tgz -C /tmp/runs --exclude=checkpoints . ; ls -la $OUT
echo "== bench_heal (1 GB: the small flavour, heals GPU to GPU)"
t3=$(date +%s)
timeout 240 python3 bench/bench_heal.py --sizes 1 $BK --out $OUT/heal_cuda.json 2>&1 | grep -v "^WARNING\|Future.get\|GET /"
echo "== bench_heal rc=${PIPESTATUS[0]} in $(( $(date +%s) - t3 )) s"
ls $OUT | head -20; pgrep -af "monarch|lighthouse|bootstrap" | head
