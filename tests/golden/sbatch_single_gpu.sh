#!/bin/bash
# dtrain sbatch: run exp1 (recipe gpt_tiny): 1 node(s) x 4 process(es), cuda/nccl, 100 steps
# Resubmit (continues from the newest checkpoint): sbatch /shared/runs/exp1/slurm/job.sbatch
#SBATCH --job-name=exp1
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --time=01:00:00
#SBATCH --partition=gpu
#SBATCH --account=proj
#SBATCH --qos=high
#SBATCH --output=/shared/runs/exp1/slurm/job-%j.out
#SBATCH --error=/shared/runs/exp1/slurm/job-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
set -uo pipefail

RUN_DIR=/shared/runs/exp1
PYTHON=/opt/venv/bin/python
cd /home/u/proj || exit 1

echo "dtrain: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST"
if [ -e "$RUN_DIR/slurm/FINISHED" ]; then
  echo "dtrain: $RUN_DIR already finished; not running it again"
  exit 0
fi
echo "$SLURM_JOB_ID" > "$RUN_DIR/slurm/job_id"
RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
RDZV_PORT=$((20000 + SLURM_JOB_ID % 20000))
TRAPPED=0
forward() { TRAPPED=1; echo "dtrain: got SIG$1, workers checkpoint and stop"; kill -s "$1" "$SRUN_PID" 2>/dev/null; }
trap 'forward USR1' USR1
rm -f "$RUN_DIR/preempted.json"
RDZV_ID="dtrain-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"
srun --export=ALL --ntasks-per-node=1 --kill-on-bad-exit=1 "$PYTHON" -m dtrain_cli agent /shared/runs/exp1 --nnodes 1 \
  --rdzv-endpoint "$RDZV_HOST:$RDZV_PORT" --rdzv-id "$RDZV_ID" &
SRUN_PID=$!
while :; do
  TRAPPED=0
  wait "$SRUN_PID"; rc=$?
  [ "$TRAPPED" = 1 ] && [ "$rc" -gt 128 ] || break  # a trap cut the wait short
done
if [ "$rc" -eq 0 ] || [ -e "$RUN_DIR/slurm/FINISHED" ]; then
  [ -e "$RUN_DIR/slurm/FINISHED" ] || date > "$RUN_DIR/slurm/FINISHED"  # a requeue of a finished run exits at once
  echo "dtrain: finished"
  exit 0
fi
if [ -e "$RUN_DIR/preempted.json" ] && [ ! -e "$RUN_DIR/slurm/FINISHED" ]; then
  if [ "${SLURM_RESTART_COUNT:-0}" -lt 20 ]; then
    echo "dtrain: checkpoint saved (srun exited with $rc); requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID" && exit 0
  fi
  echo "dtrain: not requeued (cluster.max_requeues=20 or scontrol failed); continue with: dtrain resume --ckpt $RUN_DIR"
fi
echo "dtrain: srun exited with $rc"
exit "$rc"
