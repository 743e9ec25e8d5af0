"""`specdec demo` (./run demo): build, serve, stream one speculative generation, run the same
prompt with speculation off, and show both texts, the acceptance and the speedup measured now."""

from __future__ import annotations

import asyncio

from rich.table import Table

from specdec.client.client import Access, Record, RequestParams, TritonClient
from specdec.config import Profile
from specdec.progress import console
from specdec.triton.serve import embedded_server

# An input-grounded task: the answer copies most of the passage, which prompt lookup predicts.
DEMO_PROMPT = (
    "Fix the spelling mistakes in the following paragraph and write it out in full:\n\n"
    "The Great Barrier Reef is the worlds largest coral reef system, composed of over 2,900 individual "
    "reefs and 900 islands streching over 2,300 kilometres. The reef is located in the Coral Sea, off "
    "the coast of Queensland, Australia. It can be seen from outer space and is the worlds biggest "
    "single structure made by living organisms."
)


def _print_chunk(text: str) -> None:
    console.print(text, end="", markup=False, highlight=False, soft_wrap=True)


async def _demo(grpc_url: str, profile: Profile, prompt: str, max_tokens: int, access: Access) -> tuple[Record, Record]:
    spec_cfg = profile.speculation
    async with TritonClient(grpc_url, access) as client:
        warm = RequestParams(max_tokens=4)
        await client.generate("Hello", warm)
        await client.generate("Hello", RequestParams(max_tokens=4, num_draft_tokens=0))

        drafts = f"up to {spec_cfg.num_draft_tokens} draft tokens" + (", adaptive" if spec_cfg.adaptive.enabled else "")
        console.rule(f"[bold]speculative decoding[/] ({spec_cfg.proposer}, {drafts}), streamed")
        console.print(f"[dim]prompt:[/] {prompt}\n")
        # each its own cache salt: the baseline must not reuse the prompt the speculative run left cached
        spec = await client.generate(
            prompt, RequestParams(max_tokens=max_tokens, cache_salt="demo speculative"), on_chunk=_print_chunk
        )
        console.print()
        console.rule("[bold]baseline[/]: the same request with speculation off (num_draft_tokens=0)")
        off = RequestParams(max_tokens=max_tokens, num_draft_tokens=0, cache_salt="demo baseline")
        base = await client.generate(prompt, off, stream=False)
        console.print(base.text, markup=False, highlight=False)
    return spec, base


def summary_table(spec: Record, base: Record) -> Table:
    table = Table(title="measured in this run")
    for col in ("", "speculative", "baseline"):
        table.add_column(col, justify="right")

    def rate(r: Record) -> float:
        return r.num_output_tokens / (r.end - r.start) if r.end > r.start else 0.0

    table.add_row("output tokens", str(spec.num_output_tokens), str(base.num_output_tokens))
    table.add_row("end-to-end time", f"{spec.end - spec.start:.2f} s", f"{base.end - base.start:.2f} s")
    table.add_row("time to first token", f"{spec.chunks[0][0] - spec.start:.2f} s" if spec.chunks else "-", "-")
    table.add_row("tokens / s", f"{rate(spec):.1f}", f"{rate(base):.1f}")
    table.add_row("acceptance rate", f"{spec.acceptance_rate:.0%}", "-")
    table.add_row("mean accepted length", f"{spec.mean_accepted_length:.2f}", "1")
    table.add_row("draft tokens (accepted)", f"{spec.total_draft_tokens} ({spec.total_accepted_draft_tokens})", "0")
    return table


def run_demo(profile: Profile, url: str | None = None, prompt: str = DEMO_PROMPT, max_tokens: int = 160,
             access: Access | None = None) -> int:  # fmt: skip
    with embedded_server(profile, url) as (grpc_url, _, _):
        spec, base = asyncio.run(_demo(grpc_url, profile, prompt, max_tokens, access or Access()))
    for name, rec in (("speculative", spec), ("baseline", base)):
        if rec.error:
            console.print(f"[red]{name} request failed:[/] {rec.error}")
            return 1
    console.print()
    console.print(summary_table(spec, base))
    identical = spec.text == base.text
    console.print(
        f"texts identical: [bold]{'yes' if identical else 'NO'}[/]   "
        f"speedup: [bold]{(base.end - base.start) / (spec.end - spec.start):.2f}x[/] (baseline time / speculative time)"
    )
    return 0 if identical else 1
