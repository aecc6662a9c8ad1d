"""The agents module the plugin's own tests load, as a user's project would (``support``).

Its model is a real provider's: a test that forgot to script it would need an API key and fail,
so every run here goes through ``wesichain_scripted``.
"""

from __future__ import annotations

from pydantic import BaseModel

from shared.agents import Agent, AgentRegistry
from shared.tools import ToolSet, tool


class OrderArgs(BaseModel):
    order_id: str


class RefundArgs(BaseModel):
    order_id: str
    cents: int


@tool
def lookup_order(args: OrderArgs) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": args.order_id, "paid_cents": 1250}


@tool
def refund(args: RefundArgs) -> str:
    """Refund part of an order."""
    return f"refunded {args.cents} cents on {args.order_id}"


registry = AgentRegistry()
registry.add(
    Agent(
        name="support",
        model="openai:gpt-4o-mini",
        system_prompt="You are a support agent.",
        tools=ToolSet([lookup_order, refund]),
        max_steps=4,
    )
)
registry.add(
    Agent(
        name="careful",
        model="openai:gpt-4o-mini",
        system_prompt="You are a support agent whose refunds a human approves.",
        tools=ToolSet([lookup_order, refund]),
        approval_required=frozenset({"refund"}),
    )
)
