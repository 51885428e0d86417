# slime with its vLLM backend (vime) launch flags (written for gate's tests)
python3 train.py \
   --hf-checkpoint /root/Qwen3-4B \
   --n-samples-per-prompt 8 \
   --rollout-max-response-len 8192 \
   --rollout-temperature 0.8 \
   --rollout-top-p 1.0 \
   --rollout-seed 42 \
   --vllm-enable-prefix-caching \
   --vllm-max-num-seqs 256
