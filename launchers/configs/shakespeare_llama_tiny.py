"""A tiny Llama (RoPE, grouped-query attention, SwiGLU, RMSNorm) on the decoder-only Shakespeare
task of `shakespeare_lm_tiny`, ending by continuing prompts:

    ./bazelw run //launchers:train -- --config=launchers/configs/shakespeare_llama_tiny.py
"""

from cairn.launchers import config_base


def get_config():
    config = config_base.base_config()
    config.experiment = "shakespeare_llama_tiny"
    config_base.shakespeare(config, __file__, "shakespeare_lm")
    config.model.kind = "llama"
    config.model.preset = "llama_tiny"
    # decoder_only_tiny's width (128, 4 heads of 32, mlp 256, 2 layers), 2 key/value heads.
    config.model.overrides = {"emb_dim": 128, "head_dim": 32, "mlp_dim": 256, "num_kv_heads": 2}
    config.data.sequence_length = {"targets": 64}
    config.data.batch_size = 32
    config_base.tiny_run(config, steps=600, learning_rate=3e-3)
    config.eval.num_examples = 32
    config.post_training.prompts = ("ROMEO. O, she doth teach", "To be, or not to be")
    config.post_training.max_decode_length = 24
    config.post_training.decode_method = "sample"
    config.post_training.temperature = 0.8
    config.post_training.top_k = 40
    return config
