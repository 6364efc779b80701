"""One module per supported architecture: config.json -> model-config fields.
Tensor naming is shared (common.py); architecture differences are fields."""

from . import deepseek_v2, deepseek_v3, gemma4, glm4_moe, glm4_moe_lite, gpt_oss, mixtral, olmoe, qwen2_moe, qwen3_moe

BY_MODEL_TYPE = {"mixtral": mixtral, "qwen2_moe": qwen2_moe, "qwen3_moe": qwen3_moe, "olmoe": olmoe,
                 "gemma4_text": gemma4, "gemma4": gemma4, "gpt_oss": gpt_oss,
                 "deepseek_v3": deepseek_v3, "deepseek_v2": deepseek_v2, "glm4_moe_lite": glm4_moe_lite,
                 "glm4_moe": glm4_moe}
