"""Per-call decoding statistics, reachable after `generate()` as `model.generation_stats`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    """What one `generate()` call did.

    ``steps`` counts forward passes of the base model (the prefill included), so plain decoding has
    ``tau == 1`` and every accepted draft token raises it. ``gate_decisions`` counts the steps where a
    draft would have fitted before ``max_length``; ``draft_steps`` those where the gate let it.
    """

    steps: int = 0
    new_tokens: int = 0
    gate_decisions: int = 0
    draft_steps: int = 0
    context_steps: int = 0
    drafted_tokens: int = 0
    accepted_draft_tokens: int = 0
    tokens_per_step: list[int] = field(default_factory=list)
    proposed_per_head: list[int] = field(default_factory=list)
    accepted_per_head: list[int] = field(default_factory=list)
    phase_seconds: dict[str, float] | None = None  # per-phase wall time, with generate(profile=True)
    calibration: str | None = None  # the cerberus_calibration entry whose defaults the call used
    strict_rows: int | None = None  # with strict=True: the most positions one verification computed

    @property
    def tau(self) -> float:
        """Mean tokens produced per base forward pass (accepted drafts plus the bonus token)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def draft_rate(self) -> float:
        """Share of gate decisions that chose to draft."""
        return self.draft_steps / self.gate_decisions if self.gate_decisions else 0.0

    @property
    def head_acceptance(self) -> list[float]:
        """Per head depth: accepted / proposed (a head only counts where every head before it was accepted)."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted_per_head, self.proposed_per_head)]

    def record_step(self, emitted: int, depth: int, nodes: int) -> None:
        """One verification (or plain) forward that emitted ``emitted`` tokens after a draft of ``nodes``
        tokens reaching ``depth`` heads deep (0 and 0 for a plain step)."""
        accepted = emitted - 1
        self.steps += 1
        self.new_tokens += emitted
        self.tokens_per_step.append(emitted)
        self.drafted_tokens += nodes
        self.accepted_draft_tokens += accepted
        for head in range(depth):
            while len(self.proposed_per_head) <= head:
                self.proposed_per_head.append(0)
                self.accepted_per_head.append(0)
            if head <= accepted:
                self.proposed_per_head[head] += 1
            if head < accepted:
                self.accepted_per_head[head] += 1

    def record_gate(self, drafted: bool) -> None:
        self.gate_decisions += 1
        self.draft_steps += int(drafted)

    def as_dict(self) -> dict:
        """Plain numbers, the derived ones included, for logs and JSON."""
        out = asdict(self)
        out.update(tau=self.tau, draft_rate=self.draft_rate, head_acceptance=self.head_acceptance)
        return out
