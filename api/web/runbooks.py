"""``/runbooks``: what to do about each incident kind, where every alert's ``runbook_url`` points.

One section per kind (its anchor is the kind: ``/runbooks#starvation``), in the
order an on-call person works: what the incident means, what to check first,
and what fixes it.  Served without sign-in, like any runbook a pager links to:
it holds no fleet data.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from gpufleet.api.web.html import Markup, h, join, page
from gpufleet.api.web.session import html

router = APIRouter(include_in_schema=False)

#: kind -> (title, what it means, what to check first, what fixes it)
RUNBOOKS: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]] = {
    "starvation": (
        "Input starvation",
        "The run's GPUs wait for data: their activity swings between busy and idle (or stays "
        "low) while the input pipeline cannot keep up. The incident's cause says CPU or I/O.",
        (
            "CPU: the job's cores used against its CPU quota, CPU pressure, throttled periods (incident page, node "
            "page 'Job cgroups').",
            "I/O: the busiest disk's utilisation, iowait and await; NFS mounts on the node page.",
            "Whether other runs on the node compete for the same CPUs or disk.",
        ),
        (
            "CPU: more data-loader workers, a larger CPU request or quota, decoding moved to the GPU, a faster "
            "governor.",
            "I/O: local NVMe caching, larger read-ahead, fewer small files (shards), a faster storage tier.",
        ),
    ),
    "checkpoint_stall": (
        "Checkpoint stalls",
        "Every GPU of the run pauses while a checkpoint is written; the incident gives the "
        "pause, the interval, the writer rank and the share of run time lost.",
        (
            "The write path (disk or network) and its rate during the pause.",
            "Whether one rank writes while the others wait (the writer is named).",
        ),
        (
            "Asynchronous or sharded (distributed) checkpointing.",
            "A faster target (local NVMe, then upload).",
            "Checkpointing less often where the restart cost allows.",
        ),
    ),
    "straggler": (
        "Straggler GPU",
        "One GPU of a synchronous job is slower than its peers, so every step waits for it. "
        "The cause names the likely reason: power cap, thermal, PCIe, clocks.",
        (
            "The GPU's power limit, temperature, clocks and PCIe link against its peers' (incident figures).",
            "Throttling or PCIe incidents on the same GPU.",
        ),
        (
            "Reset the power limit (nvidia-smi -pl) to the peers'.",
            "Fix the cooling or airflow of a hot GPU.",
            "Reseat or replace a degraded riser; drain the node if the GPU cannot be fixed now.",
        ),
    ),
    "throttling": (
        "GPU throttling",
        "The GPUs run below their maximum clock while busy, held down by the power cap, heat, "
        "a hardware slowdown signal or the power brake; one incident lists every GPU of the run throttled for "
        "one reason.",
        (
            "The reason and the share of busy time throttled.",
            "The hottest GPU's temperature; the power against the limit.",
        ),
        (
            "Thermal: check fans, airflow, inlet temperature; drain the node if it keeps overheating.",
            "Power cap: raise a cap set below the board's default, or accept it knowingly.",
            "HW slowdown / power brake: the node's power supply or BMC; involve the hardware team.",
        ),
    ),
    "pcie_degraded": (
        "Degraded PCIe link",
        "The GPU's PCIe link trained at a lower generation or width than its maximum, "
        "cutting host-GPU bandwidth.",
        ("The link now against its maximum (incident figures).", "PCIe replay incidents on the same GPU."),
        ("Reseat the GPU or riser; check BIOS PCIe settings.", "Replace the riser or cable if it persists."),
    ),
    "host_misconfig": (
        "Host misconfiguration",
        "A node setting or fault holds its jobs back: a job CPU quota below one core per "
        "GPU, GPU processes on the far NUMA node, NFS stalls, a powersave CPU governor, or repeated XID errors.",
        ("The node page's checks: each with its finding, number and decision.",),
        (
            "Raise the job's CPU request; bind processes to the GPU's NUMA node; set the governor to "
            "performance.",
            "Repeated XIDs: read the decoded codes; hardware XIDs mean draining the node.",
        ),
    ),
    "nvlink_degraded": (
        "NVLink degraded",
        "NVLink links are down, collectives fell back to PCIe, or link errors keep rising.",
        ("Links up against expected; NVLink against PCIe traffic; CRC and replay errors per minute.",),
        (
            "Links down or errors: drain the node and reseat or replace the NVLink bridge / baseboard.",
            "PCIe fallback: start the fabric manager, enable peer access.",
        ),
    ),
    "gpu_health": (
        "GPU health",
        "GPU memory errors (uncorrectable ECC, failed or pending row remaps, a storm of "
        "correctable errors) or a PCIe link that keeps replaying.",
        ("The cause and its counts; the XIDs the GPU logged.",),
        (
            "Uncorrectable ECC or a failed remap: drain the node now; a failed remap means RMA.",
            "Pending remap: drain and reset the GPU at the next opportunity.",
            "Correctable storm or PCIe replays: plan the replacement; reseat the riser.",
        ),
    ),
    "idle_allocation": (
        "Idle allocation",
        "GPUs held by a run have done no work for a long time: billed, and kept from other "
        "jobs. The incident names them and since when.",
        (
            "Whether the job is a notebook left open, a crashed loader with a live process, or asked for more GPUs "
            "than it uses.",
        ),
        ("Ask the run's team to release the GPUs or end the job; right-size the request.",),
    ),
    "hung_collective": (
        "Hung collective",
        "The run's working GPUs spin at full utilisation and idle power with no progress: a "
        "rank died or blocked and the others wait for it in a collective.",
        ("The dead rank named by the incident: its node, its agent, its process.",),
        ("Restart or requeue the job; drain the node of the dead rank if its GPU or host is at fault.",),
    ),
}


def _section(kind: str, title: str, means: str, checks: tuple[str, ...], fixes: tuple[str, ...]) -> Markup:
    items = lambda xs: join((h("<li>{}</li>", x) for x in xs), "")  # noqa: E731
    return h(
        '<section id="{}"><h2>{}</h2><p>{}</p><h3>Check first</h3><ul>{}</ul><h3>Fix</h3><ul>{}</ul>'
        "</section>",
        kind,
        title,
        means,
        items(checks),
        items(fixes),
    )


@router.get("/runbooks")
async def runbooks() -> Response:
    body = join(
        (
            h(
                '<p class="hint">Each alert links to its kind here (<code>runbook_url</code>) and to its '
                "incident's page, which has the cause in words and its numbers.</p>"
            ),
            *(_section(k, *v) for k, v in RUNBOOKS.items()),
        )
    )
    return html(page("Runbooks", body))
