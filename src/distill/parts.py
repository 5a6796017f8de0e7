"""The built-in parts, declared: every generation engine, teacher location, method and run feature distill ships,
each by its name, its settings (leaf `PartFields` classes) and the import path of its implementation, which is
imported when the part is first used (vLLM's model registry does the same). This is the one way a built-in part
registers; a part made elsewhere (a user's, a test's toy) registers as an object (`register`, `register_location`,
`register_engine`, `register_feature`).

Declaring composes the settings into `DistillConfig` (`distill.config`), so making a config imports the settings'
leaf modules and these tables only: no part's code, no torch. The tables load this catalogue when first used and
the config before its first instance, by import path (`distill.registry.BUILT_IN_PARTS`), so no leaf imports up
to it. The order of the declarations below is the order of the parts' settings in config.yaml and `--help`
(engines, locations, methods; run features keep their place among the core's fields, `PartFields.placed_after`).
It also registers the config's rules (`distill.config_rules.checks.validate`), which know every part.

The model kinds have no settings, and their table lives with their interface (`distill.models.kinds`, which imports
torch): it hands itself to `declare_model_kinds` when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill import registry
from distill.conversations.fields import ConversationFields
from distill.doctor.fields import DoctorFields
from distill.features import FEATURES
from distill.generation.registry import ENGINES
from distill.generation.vllm_fields import VllmFields, VllmServerFields
from distill.locations.registry import LOCATIONS
from distill.methods.async_fields import AsyncFields
from distill.methods.base import METHODS
from distill.methods.iw_opd_fields import IwOpdFields
from distill.methods.mixing_fields import MixingFields
from distill.methods.multi_turn_fields import MultiTurnFields
from distill.methods.reuse_fields import RolloutReuseFields
from distill.methods.sdft_fields import SdftFields
from distill.methods.sdpo.fields import SdpoFields
from distill.methods.self_teacher_fields import SelfTeacherFields
from distill.settings.gold import GoldFields
from distill.settings.locations import CacheFields, RemoteTeacherFields, ServerFields
from distill.training.vision_fields import VisionFields

if TYPE_CHECKING:
    from distill.models.kinds import ModelKind

CONFIG_RULES = "distill.config_rules.checks:validate"

_state = {"loaded": False}


def load() -> bool:
    """Declare the built-in parts, once (a second call, or one made while they are declared, does nothing); True
    when this call declared them."""
    if _state["loaded"]:
        return False
    _state["loaded"] = True
    try:
        _declare()
    except BaseException:
        _state["loaded"] = False
        raise
    return True


def _declare() -> None:
    registry.register_config_rules(CONFIG_RULES)

    # generation engines (`generation_engine`; listed in order of preference under `auto`)
    ENGINES.declare("hf", "distill.generation.hf:HFGenerate")
    ENGINES.declare("lean", "distill.generation.lean:LeanDecode")
    ENGINES.declare("vllm", "distill.generation.vllm_engine:ENGINE", VllmFields)
    ENGINES.declare("vllm_server", "distill.generation.vllm_server:ENGINE", VllmServerFields)

    # teacher locations, asked in this order; the model (the fallback) is asked last
    LOCATIONS.declare("self", "distill.locations.self_teacher:SelfLocation")
    LOCATIONS.declare("none", "distill.locations.no_teacher:NoTeacher")
    LOCATIONS.declare("cache", "distill.locations.cache:CacheLocation", (CacheFields, RemoteTeacherFields))
    LOCATIONS.declare("server", "distill.locations.server:ServerLocation", (ServerFields, RemoteTeacherFields))
    LOCATIONS.declare("model", "distill.locations.model:ModelLocation")

    # methods (`method`)
    METHODS.declare("gkd", "distill.methods.gkd:GKD", (MixingFields, MultiTurnFields))
    METHODS.declare("gold", "distill.methods.gold:GOLD", (MixingFields, GoldFields))
    METHODS.declare("iw_opd", "distill.methods.iw_opd:IWOPD", (IwOpdFields, RolloutReuseFields))
    METHODS.declare("on_policy", "distill.methods.on_policy:OnPolicy", MultiTurnFields)
    METHODS.declare("sdft", "distill.methods.sdft:SDFT", (RolloutReuseFields, SelfTeacherFields, SdftFields))
    METHODS.declare("sft", "distill.methods.sft:SFT", SelfTeacherFields)
    METHODS.declare("sdpo", "distill.methods.sdpo.method:SDPO", (RolloutReuseFields, SelfTeacherFields, SdpoFields))

    # run features (every method may use them); the doctor's setting sits among the conversations' (its place)
    FEATURES.declare("conversations", "distill.agents.feature:Conversations", ConversationFields)
    FEATURES.declare("doctor", "distill.doctor.fields:Doctor", DoctorFields)
    FEATURES.declare("async_rollouts", "distill.training.async_feature:AsyncRollouts", AsyncFields)
    FEATURES.declare("vision", "distill.training.vision_fields:Vision", VisionFields)


def declare_model_kinds(kinds: registry.Registry[ModelKind]) -> None:
    """The built-in model kinds, in the order they are asked last to first (`causal_lm`, the fallback, last)."""
    kinds.declare("causal_lm", "distill.models.kinds:CausalLM")
    kinds.declare("vision_language", "distill.models.kinds:VisionLanguage")
