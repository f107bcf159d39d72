"""Human summaries of a plan (rich tables); the CLI only prints what this builds."""

from __future__ import annotations

from rich.table import Table

from hpcrun.plan.values import Plan
from hpcrun.units import format_capacity, format_duration, format_size


def plan_table(plan: Plan, out_dir: str) -> Table:
    c = plan.campaign
    table = Table(title=f"hpcrun plan: {c.name} at {plan.profile.name}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    chains = sorted({j.chains_per_node for j in plan.jobs})
    arrays = sum(1 for s in plan.scripts if s.array)
    rows = [
        ("plan directory", out_dir),
        ("partition / QOS", f"{plan.partition_name} / {plan.qos or '-'}"),
        ("container", c.container.runtime + (f" ({c.container.image})" if c.container.image else "")),
        ("inputs", f"{sum(len(j.inputs) for j in plan.jobs)} files, {format_size(plan.input_bytes)}"),
        ("jobs", f"{len(plan.jobs)} in {len(plan.scripts)} script(s)" + (f", {arrays} array(s)" if arrays else "")),
        ("nodes per job", str(c.jobs.nodes)),
        ("chains per node", ", ".join(map(str, chains[:5])) + (" ..." if len(chains) > 5 else "")),
        ("walltime per job", format_duration(c.walltime)),
        ("nodes in all", str(len(plan.jobs) * c.jobs.nodes)),
        ("core-hours (max)", f"{plan.core_hours:,.1f}"),
        ("database", f"{plan.database.server}, payload {format_size(plan.database.payload_bytes)}"
         if plan.database else "none"),
        ("burst buffer", (f"{plan.profile.burst_buffer.system}, pool {plan.pool.name}: "
                          f"{format_capacity(plan.bb_max)} max per job, "
                          f"{format_size(plan.bb_total)} in all") if plan.bb_system and plan.pool else "none"),
        ("bytes to stage in / out", f"{format_size(plan.stage_in_bytes)} / {format_size(plan.stage_out_bytes)}"),
    ]
    for what, value in rows:
        table.add_row(what, value)
    for note in plan.notes:
        table.add_row("note", note)
    return table
