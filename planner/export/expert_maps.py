"""A pool's expert placement in each engine's format, from the plan's placement map
(``experts-ep*-r*.json``: ``physical_to_logical_map`` per MoE layer, physical slot ``p`` on EP rank
``p // slots_per_gpu``).

- SGLang ``--init-expert-location``: a JSON object with exactly ``physical_to_logical_map``, one row per
  hidden layer (``num_hidden_layers`` x ``experts + redundant``). Dense layers (DeepSeek's first three)
  get the trivial map SGLang itself builds (``p mod experts``); they hold no experts.
- TensorRT-LLM ``moe_config.load_balancer``: ``num_slots`` and ``initial_global_assignments`` (layer index
  -> logical expert of every slot), in the ``--config`` YAML.
- vLLM takes no explicit map (``--eplb-config`` gives the redundant count; its balancer places copies at
  run time): the export says so in a small JSON beside the launch script.
"""

from __future__ import annotations

from planner.export.deploy import Deployment


def moe_rows(doc: dict, d: Deployment) -> dict[int, list[int]]:
    """Hidden-layer index -> logical expert of every physical slot, for the MoE layers."""
    rows = doc["physical_to_logical_map"]
    first_moe = d.layers - d.moe_layers
    slots = d.experts + d.redundant_experts
    if len(rows) not in (1, d.moe_layers) or any(len(r) != slots for r in rows):
        raise ValueError(f"{d.pool}: placement map shape {len(rows)} x {len(rows[0]) if rows else 0} does not match "
                         f"{d.moe_layers} MoE layers x {slots} slots")
    if len(rows) == 1:
        rows = rows * d.moe_layers
    return {first_moe + i: [int(e) for e in r] for i, r in enumerate(rows)}


def sglang_location(doc: dict, d: Deployment) -> dict:
    slots = d.experts + d.redundant_experts
    moe = moe_rows(doc, d)
    trivial = [p % d.experts for p in range(slots)]
    return {"physical_to_logical_map": [moe.get(layer, trivial) for layer in range(d.layers)]}


def trtllm_assignments(doc: dict, d: Deployment) -> dict[int, list[int]]:
    return moe_rows(doc, d)


def vllm_note(d: Deployment) -> dict:
    return {
        "engine": "vllm",
        "explicit_map": False,
        "num_redundant_experts": d.redundant_experts,
        "eplb_config": {"num_redundant_experts": d.redundant_experts},
        "note": ("vLLM takes no explicit expert-to-GPU map: --enable-eplb with --eplb-config places the redundant "
                 "copies from the load it measures at run time; the plan's placement (its imbalance is what the "
                 "plan was priced with) is in the plan's map file for reference."),
    }
