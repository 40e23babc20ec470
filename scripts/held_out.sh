# The held-out files: no training sample the GPU scripts add may share a position with one of them (sourced by
# scripts/gpu_more_data.sh, which leaves their positions out, and scripts/gpu_base.sh, whose picks name them).
held=(data/eval.jsonl.gz data/strength.jsonl.gz data/puzzles_eval.jsonl.gz data/eval_histories.jsonl.gz
      data/mate_in_one.tsv data/openings.txt)
