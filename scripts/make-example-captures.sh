#!/usr/bin/env bash
# Re-make the committed example captures on a GPU machine with `profattr capture` (run from the checkout's root).
#
#   scripts/make-example-captures.sh workload OUTDIR           built-in workload: eager/graph, loop/grouped, TP2
#                                      (ONLY="name name" re-makes only those captures)
#   scripts/make-example-captures.sh sglang OUTDIR MODEL_DIR   SGLang with two MoE runner backends, one GPU each
#                                      (BATCHES="1 4" for several decode batch sizes; MODES="graph eager" adds
#                                      eager captures with SGLang's layerwise NVTX, the --mapping for graph ones)
#
# Where only the nsys CLI is installed (no host importer), each capture leaves NAME.qdstrm; finish it on a machine
# with a full Nsight Systems: `profattr capture --finish OUTDIR --name NAME`.
set -uo pipefail
what=${1:?workload|sglang}; out=${2:?OUTDIR}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cap() { python3 -m profattr capture -o "$out" --steps 20 "$@" || echo "capture failed ($?): $*"; }
case "$what" in
  workload)
    w=(--workload moe-decode --timeout 240)
    # grouped experts as gather + bmm: torch._grouped_mm launches through a CUDA 13 runtime call that Nsight
    # Systems 2023.4.4's importer cannot decode ("Unknown runtime API function index: 468"), which ends the import.
    g=(-- --grouped-kernel bmm)
    only=${ONLY:-all}
    run() { [ "$only" = all ] || [[ " $only " == *" $1 "* ]]; }
    run wl-eager-loop && cap "${w[@]}" --mode eager --moe-impl loop --name wl-eager-loop
    run wl-eager-grouped && cap "${w[@]}" --mode eager --moe-impl grouped --name wl-eager-grouped "${g[@]}"
    run wl-graph-grouped-after && cap "${w[@]}" --mode graph --moe-impl grouped --graph-window after \
      --name wl-graph-grouped-after "${g[@]}"
    run wl-graph-grouped-before && cap "${w[@]}" --mode graph --moe-impl grouped --graph-window before \
      --name wl-graph-grouped-before "${g[@]}"
    run wl-graph-loop-before && cap "${w[@]}" --mode graph --moe-impl loop --graph-window before \
      --name wl-graph-loop-before
    if run wl-graph-grouped-tp2 && [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
      cap "${w[@]}" --mode graph --moe-impl grouped --graph-window before --tp 2 --name wl-graph-grouped-tp2 "${g[@]}"
    fi
    ;;
  sglang)
    model=${3:?MODEL_DIR}
    server=(--load-format dummy --skip-tokenizer-init --attention-backend triton --grammar-backend none
            --sampling-backend pytorch --disable-piecewise-cuda-graph --mem-fraction-static 0.3 --cuda-graph-max-bs 4
            --disable-radix-cache)
    gpus=$(nvidia-smi -L | wc -l)
    for mode in ${MODES:-graph}; do
      # eager: SGLang's per-module NVTX ranges, no CUDA graphs: the mapping capture for the graph captures
      extra=(); suffix=""
      [ "$mode" = eager ] && { extra=(--disable-cuda-graph --enable-layerwise-nvtx-marker); suffix="-eager"; }
      for batch in ${BATCHES:-1}; do
        i=0
        for backend in triton triton_kernel; do
          dev=$(( i % gpus ))
          CUDA_VISIBLE_DEVICES=$dev cap --model "$model" --backend "$backend" --port $((30000 + i)) --batch "$batch" \
            --health-timeout 400 --max-new-tokens 64 --name "sglang-$backend-bs$batch$suffix" \
            -- "${server[@]}" "${extra[@]}" &
          i=$((i + 1))
          [ "$gpus" -ge 2 ] || wait
        done
        wait
      done
    done
    ;;
  *) echo "usage: $0 workload|sglang OUTDIR [MODEL_DIR]" >&2; exit 2;;
esac
ls -la "$out"
