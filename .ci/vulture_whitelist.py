"""Names vulture cannot see used, each with the reason (`make lint` runs vulture with this file).

Everything else vulture reports is dead code and is removed, not listed here.
"""
# ruff: noqa: B018, F821

# Record fields read only through pydantic's serialisation (specflow.spec.serialize.as_json,
# model_dump): they are the JSON that `headroom --json` (spec/memory.py Headroom, every field the
# text shows and more), champion.json, ledger points and MLflow artifacts carry.
_.memory_per_device_bytes
_.target_weight_bytes
_.draft_weight_bytes
_.reserve_bytes
_.kv_bytes_per_token_target
_.kv_bytes_per_token_draft
_.concurrency_at_context_without_drafter
_.context_len
_.kv_tokens
_.skipped  # records/summaries.py: fields of the flow's result (Prefect and the CLI's caller)
_.recorded_failed
_.champion_regressed
_.acceptance_drops  # champions/promote.py GateResult
_.forced
_.decision_table  # champions/promote.py Evidence, VersionedRecord
_.created_at
_.wall_s  # engine/loadgen.py JobResult
_.mtp_aliases  # engine/vllm_check.py VllmFacts
_.mean_prompt_tokens  # workloads/model.py MaterializedWorkload
_.max_prompt_tokens

# Pydantic: schema fields (validated from conf/, documented for users) and validators that
# pydantic calls.
_.model_config
_.active_params
_.device_name
_.memory_bandwidth_tbps
_.bf16_tflops
_.p99_tpot_ms
_.p99_ttft_ms
_.p99_itl_ms
_.p99_e2el_ms
_._kv_shared_has_no_layers
_._needs_hub_only_for_hf
_._one_way
_._one_source  # spec/schema.py WatchSpec (a pydantic validator)
_._champions_beside_a_remote_ledger  # spec/schema.py Spec (a pydantic validator)
_._ordered
_._has_layers
_._confirm_starts_within_their_most
_._read_older  # champions/promote.py: reads a schema 1 champion file

# Attributes set on tokenizers and Hugging Face configs that their libraries read (demo/tiny.py).
_.pre_tokenizer
_.decoder
_.architectures
_.draft_vocab_size
_.target_hidden_size
_.eagle_aux_hidden_state_layer_ids
# The agreeing target's next-token function f(t): what the tests check its generations against.
_.next_token

# Signatures fixed by others: Prefect's retry-condition hook (task, task_run, state) and the
# task/flow parameters that only Prefect's run-name templates read.
task_run
engine_name
run_label
# functools.lru_cache key: the file's mtime invalidates the cached YAML (config/compose.py).
mtime

# The ledger's event-log reader (engine starts and failures, for people and tests).
_.events

# Computed fields only the decision's JSON reads (decision/model.py as_json: champion.json).
_.fraction
# bench/decision_quality.py Figures: fields that reach the JSON line through asdict.
_.wrong_count
# RequestStats fields kept with each request for people and later analyses (the ledger record,
# measurement.json): the first token's latency.
_.ttft_s
# AcceptanceProfile fields that only its JSON file carries (specflow/spec/profile.py).
drafter_model
by_prompt_length
# TraceSource's field paths, read by name (getattr(src, f"{name}_field"), spec/traces.py).
messages_field
prompt_field
tools_field
max_tokens_field
output_tokens_field
timestamp_field
# MaterializedWorkload: each request's output length, for people and tests (the dataset file
# carries it to the bench).
_.output_lengths
_.target_load  # read by the report from the decision's settings (analysis.settings)
# Ledger._path: a window file's local path, for the tests that damage one
_._path
_.exc_text  # pipelines/sweep.py: a log record's cached traceback, cleared for a StoreError
