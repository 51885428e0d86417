# OpenRLHF GRPO launch, the vLLM engines on GPUs of their own (written for gate's tests)
ray job submit --address="http://127.0.0.1:8265" \
   -- python3 -m openrlhf.cli.train_ppo_ray \
   --actor.model_name_or_path meta-llama/Llama-3.1-8B-Instruct \
   --vllm.num_engines 4 \
   --vllm.tensor_parallel_size 2 \
   --vllm.gpu_memory_utilization 0.5 \
   --vllm.enable_prefix_caching \
   --train.seed 7 \
   --rollout.n_samples_per_prompt 8 \
   --rollout.max_new_tokens 1024 \
   --rollout.temperature=0.6 \
   --data.max_len 4096 \
   --actor.eps_clip_low_high 0.2 0.28 \
   --algo.advantage.estimator group_norm \
   --algo.advantage.is_correction_level token
