# SkyRL GSM8K launch, Hydra-style overrides (written for gate's tests)
uv run --isolated --extra vllm -m skyrl_train.entrypoints.main_base \
  trainer.policy.model.path="Qwen/Qwen2.5-1.5B-Instruct" \
  trainer.seed=42 \
  trainer.placement.colocate_all=true \
  generator.n_samples_per_prompt=5 \
  generator.sampling_params.max_generate_length=1024 \
  generator.sampling_params.temperature=1.0 \
  generator.sampling_params.top_p=1.0 \
  generator.sampling_params.top_k=-1 \
  generator.inference_engine.model_dtype=bfloat16 \
  generator.inference_engine.tensor_parallel_size=1 \
  generator.inference_engine.gpu_memory_utilization=0.8 \
  generator.inference_engine.enable_prefix_caching=true \
  generator.inference_engine.weight_sync_backend=nccl \
  +generator.inference_engine.engine_init_kwargs.max_num_seqs=128
