"""`headroom sim`: run the simulator under uvicorn until Ctrl-C."""

from __future__ import annotations

import click

from collector.sim.config import FLAVORS

__all__ = ["sim"]


@click.command("sim")
@click.option("--listen", default="127.0.0.1:8000", show_default=True, help="HOST:PORT to serve on.")
@click.option(
    "--flavor",
    type=click.Choice(FLAVORS),
    default="vllm",
    show_default=True,
    help="Whose /metrics names to expose.",
)
@click.option("--model", default="headroom-sim", show_default=True, help="Model id in /v1/models.")
@click.option(
    "--max-num-seqs",
    type=int,
    default=16,
    show_default=True,
    help="Most requests in the running batch (request caliber).",
)
@click.option(
    "--max-num-batched-tokens",
    type=int,
    default=2048,
    show_default=True,
    help="Token budget per step; longer prompts are prefilled in chunks (token caliber).",
)
@click.option(
    "--kv-cache-tokens",
    type=int,
    default=65536,
    show_default=True,
    help="KV-cache size in tokens (whole blocks of --block-size).",
)
@click.option("--block-size", type=int, default=16, show_default=True, help="KV block size in tokens.")
@click.option(
    "--max-waiting",
    type=int,
    default=256,
    show_default=True,
    help="Queue length beyond which requests get 429 with Retry-After.",
)
@click.option(
    "--speed",
    type=float,
    default=1.0,
    show_default=True,
    help="Simulated seconds per real second (10 = ten times faster than the model).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for output lengths.")
@click.option(
    "--mean-output-tokens",
    type=int,
    default=128,
    show_default=True,
    help="Mean output length when EOS is not ignored.",
)
@click.option(
    "--stream-interval",
    type=int,
    default=1,
    show_default=True,
    help="Tokens per streamed chunk after the first, like vLLM/SGLang --stream-interval.",
)
@click.option(
    "--cost-profile",
    type=click.Choice(["gpu", "cpu"]),
    default="gpu",
    show_default=True,
    help="Step-time model: gpu (memory-bound: batching is nearly free, TTFT flat until "
    "the batch is full) or cpu (compute-bound: TTFT and TPOT grow with the batch "
    "before anything waits, like llama.cpp on a CPU). See docs/simulator.md.",
)
@click.option(
    "--legacy-vllm-kv-metric",
    is_flag=True,
    help="Expose vllm:gpu_cache_usage_perc (vLLM before 0.10) instead of kv_cache_usage_perc.",
)
@click.option(
    "--per-request-metrics",
    is_flag=True,
    help="Answer each request with its engine-side `metrics` (queue, time to first token, "
    "generation time, mean ITL, tokens/s), like vLLM's --enable-per-request-metrics; --flavor "
    "vllm only (llama.cpp's `timings` are always sent). See docs/simulator.md.",
)
@click.option(
    "--lora-adapters",
    default="",
    help="Comma-separated LoRA adapter names served beside --model (/v1/models lists each with "
    "its parent); a request naming one runs with that adapter.",
)
@click.option(
    "--max-loras",
    type=int,
    default=4,
    show_default=True,
    help="Adapter slots: most distinct adapters in the running batch and on the GPU (vLLM --max-loras).",
)
@click.option(
    "--lora-load-ms",
    type=float,
    default=50.0,
    show_default=True,
    help="Simulated milliseconds to load an adapter into a free GPU slot (added to that step).",
)
def sim(
    listen: str,
    flavor: str,
    model: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    kv_cache_tokens: int,
    block_size: int,
    max_waiting: int,
    speed: float,
    seed: int,
    mean_output_tokens: int,
    stream_interval: int,
    cost_profile: str,
    legacy_vllm_kv_metric: bool,
    per_request_metrics: bool,
    lora_adapters: str,
    max_loras: int,
    lora_load_ms: float,
) -> None:
    """Built-in continuous-batching engine simulator with an OpenAI-compatible API.

    \b
    Examples:
      headroom sim                                        # vLLM-style on 127.0.0.1:8000
      headroom sim --flavor sglang --max-num-seqs 8 --speed 10
      headroom sim --flavor llamacpp --listen 127.0.0.1:8080 --kv-cache-tokens 8192
      headroom sim --cost-profile cpu --max-num-seqs 4    # compute-bound, like llama.cpp on a CPU
      headroom sim --lora-adapters a,b,c,d,e,f,g,h --max-loras 4   # 8 adapters over 4 slots
      headroom sim --per-request-metrics                  # vLLM's per-request `metrics` in answers
      curl -N localhost:8000/v1/chat/completions -d '{"messages":[{"role":"user","content":"hi"}],"stream":true}'

    Serves /v1/chat/completions, /v1/completions, /v1/models, the engine's /metrics in the
    chosen flavor's names, /slots (llama.cpp style) and /sim/state (ground truth as JSON).
    The step-time model and the knee it predicts are in docs/simulator.md.
    """
    # lazy: `headroom sim --help` must not load uvicorn and the simulator's FastAPI app
    import uvicorn

    from collector.serving import parse_listen
    from collector.sim.app import create_sim_app
    from collector.sim.config import SimConfig

    try:
        host, port = parse_listen(listen)
        config = SimConfig(
            flavor=flavor,
            model=model,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_tokens=kv_cache_tokens,
            block_size=block_size,
            max_waiting=max_waiting,
            speed=speed,
            seed=seed,
            mean_output_tokens=mean_output_tokens,
            stream_interval=stream_interval,
            vllm_legacy_kv_metric=legacy_vllm_kv_metric,
            per_request_metrics=per_request_metrics,
            cost_profile=cost_profile,
            lora_adapters=tuple(name.strip() for name in lora_adapters.split(",") if name.strip()),
            max_loras=max_loras,
            lora_load_s=lora_load_ms / 1000,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(
        f"headroom sim ({flavor}, {cost_profile} cost profile) on http://{host}:{port}  "
        f"max_num_seqs={max_num_seqs} kv_cache_tokens={kv_cache_tokens} speed={speed}",
        err=True,
    )
    uvicorn.run(create_sim_app(config), host=host, port=port, log_level="warning", access_log=False)
