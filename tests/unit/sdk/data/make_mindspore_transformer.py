"""Writes mindspore_transformer.npz, which tests/unit/sdk/test_sdk_transformer.py reads: python
make_mindspore_transformer.py DIR, under MindSpore 2.7.0 (not run by the tests: tessel does not depend on MindSpore).

Each case builds a MindSpore cell in eval mode, sets its parameters to random values (set_data) and calls it with
random inputs. Stored per case: the parameters ("<case>.<name>"), the inputs ("<case>.in.<input>"), the outputs
("<case>.out<i>"), random cotangents ("<case>.r<i>") and the gradients of sum(out_i * r_i) with respect to each
float input whose name starts with "x" ("<case>.dx.<input>") and each parameter ("<case>.d.<name>"). "cases" holds
the case list as JSON: (name, nn class, constructor arguments, positional inputs, keyword inputs, keyword values).
An encoder case's constructor arguments are those of its TransformerEncoderLayer plus num_layers and has_norm.

It also saves transformer_encoder.ckpt, a batch-first 2-layer TransformerEncoder (d_model 8, 2 heads, feed-forward
16, gelu, final LayerNorm) with MindSpore's own initial values, and stores an input "ckpt.x" and its output "ckpt.y".
"""

import json
import sys

import mindspore as ms
import numpy as np
from mindspore import nn

ms.set_context(mode=ms.PYNATIVE_MODE)

E, H, L, S, N = 8, 2, 4, 5, 3
CASES = [
    ("self", "MultiheadAttention", dict(embed_dim=E, num_heads=H), ["xq", "xq", "xq"], {}, {}),
    (
        "self_bf_heads",
        "MultiheadAttention",
        dict(embed_dim=E, num_heads=H, batch_first=True),
        ["xqb", "xqb", "xqb"],
        {},
        dict(average_attn_weights=False),
    ),
    ("cross", "MultiheadAttention", dict(embed_dim=E, num_heads=H), ["xq", "xk", "xv"], {}, {}),
    ("cross_kv", "MultiheadAttention", dict(embed_dim=E, num_heads=H), ["xq", "xk", "xk"], {}, {}),
    (
        "kdim_vdim",
        "MultiheadAttention",
        dict(embed_dim=E, num_heads=H, kdim=4, vdim=6, batch_first=True),
        ["xqb", "xk4b", "xv6b"],
        {},
        {},
    ),
    (
        "kpm_bool",
        "MultiheadAttention",
        dict(embed_dim=E, num_heads=H),
        ["xq", "xk", "xv"],
        {"key_padding_mask": "kpm_b"},
        {},
    ),
    (
        "kpm_float",
        "MultiheadAttention",
        dict(embed_dim=E, num_heads=H),
        ["xq", "xk", "xv"],
        {"key_padding_mask": "kpm_f"},
        {},
    ),
    (
        "am_bool",
        "MultiheadAttention",
        dict(embed_dim=E, num_heads=H),
        ["xq", "xq", "xq"],
        {"attn_mask": "causal_b"},
        {},
    ),
    (
        "am_float",
        "MultiheadAttention",
        dict(embed_dim=E, num_heads=H),
        ["xq", "xq", "xq"],
        {"attn_mask": "causal_f"},
        {},
    ),
    ("am_3d", "MultiheadAttention", dict(embed_dim=E, num_heads=H), ["xq", "xk", "xv"], {"attn_mask": "am3_f"}, {}),
    (
        "both_bool",
        "MultiheadAttention",
        dict(embed_dim=E, num_heads=H, batch_first=True),
        ["xqb", "xkb", "xkb"],
        {"attn_mask": "am_b", "key_padding_mask": "kpm_b"},
        dict(average_attn_weights=False),
    ),
    (
        "no_weights",
        "MultiheadAttention",
        dict(embed_dim=E, num_heads=H),
        ["xq", "xk", "xv"],
        {"key_padding_mask": "kpm_f"},
        dict(need_weights=False),
    ),
    (
        "bias_kv_zero_attn",
        "MultiheadAttention",
        dict(embed_dim=E, num_heads=H, add_bias_kv=True, add_zero_attn=True),
        ["xq", "xk", "xv"],
        {"attn_mask": "am_b", "key_padding_mask": "kpm_b"},
        {},
    ),
    ("no_bias", "MultiheadAttention", dict(embed_dim=E, num_heads=H, has_bias=False), ["xq", "xk", "xv"], {}, {}),
    (
        "unbatched",
        "MultiheadAttention",
        dict(embed_dim=E, num_heads=H),
        ["xu", "xu", "xu"],
        {"key_padding_mask": "kpm_u"},
        {},
    ),
    ("enc_post_relu", "TransformerEncoderLayer", dict(d_model=E, nhead=H, dim_feedforward=16), ["xq"], {}, {}),
    (
        "enc_pre_gelu",
        "TransformerEncoderLayer",
        dict(d_model=E, nhead=H, dim_feedforward=16, activation="gelu", norm_first=True),
        ["xq"],
        {"src_key_padding_mask": "kpm_bq"},
        {},
    ),
    (
        "enc_post_gelu_bf",
        "TransformerEncoderLayer",
        dict(d_model=E, nhead=H, dim_feedforward=16, activation="gelu", batch_first=True),
        ["xqb"],
        {"src_mask": "causal_b"},
        {},
    ),
    (
        "enc_pre_relu",
        "TransformerEncoderLayer",
        dict(d_model=E, nhead=H, dim_feedforward=16, norm_first=True),
        ["xq"],
        {"src_mask": "causal_f"},
        {},
    ),
    (
        "encoder2_post",
        "TransformerEncoder",
        dict(d_model=E, nhead=H, dim_feedforward=16, num_layers=2, has_norm=True),
        ["xq"],
        {"src_key_padding_mask": "kpm_bq"},
        {},
    ),
    (
        "encoder2_pre_gelu",
        "TransformerEncoder",
        dict(d_model=E, nhead=H, dim_feedforward=16, activation="gelu", norm_first=True, num_layers=2, has_norm=False),
        ["xq"],
        {"src_mask": "causal_b"},
        {},
    ),
    (
        "dec_post",
        "TransformerDecoderLayer",
        dict(d_model=E, nhead=H, dim_feedforward=16),
        ["xq", "xk"],
        {"tgt_mask": "causal_b", "memory_key_padding_mask": "kpm_b"},
        {},
    ),
    (
        "dec_pre_gelu",
        "TransformerDecoderLayer",
        dict(d_model=E, nhead=H, dim_feedforward=16, activation="gelu", norm_first=True),
        ["xq", "xk"],
        {"tgt_mask": "causal_f"},
        {},
    ),
    (
        "transformer",
        "Transformer",
        dict(d_model=E, nhead=H, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=16),
        ["xk", "xq"],
        {"tgt_mask": "causal_b", "src_key_padding_mask": "kpm_b"},
        {},
    ),
]


def inputs(rng):
    causal = np.triu(np.ones((L, L), bool), 1)
    am = rng.random((L, S)) < 0.3
    am[:, 0] = False  # no row fully masked
    kpm = np.zeros((N, S), bool)
    kpm[0, -2:] = kpm[1, -1] = True
    kpm_q = np.zeros((N, L), bool)
    kpm_q[0, -1] = kpm_q[2, -2:] = True
    normal = rng.standard_normal
    return {
        "xq": normal((L, N, E)),
        "xqb": normal((N, L, E)),
        "xk": normal((S, N, E)),
        "xv": normal((S, N, E)),
        "xkb": normal((N, S, E)),
        "xk4b": normal((N, S, 4)),
        "xv6b": normal((N, S, 6)),
        "xu": normal((L, E)),
        "kpm_b": kpm,
        "kpm_f": np.where(kpm, -1e9, 0.3 * normal((N, S))),
        "kpm_bq": kpm_q,
        "kpm_u": np.array([False, False, True, False]),
        "causal_b": causal,
        "causal_f": np.where(causal, -1e9, 0.0),
        "am_b": am,
        "am3_f": 0.5 * normal((N * H, L, S)),
    }


def build(cls, kw):
    if cls == "TransformerEncoder":
        kw = dict(kw)
        layers, has_norm = kw.pop("num_layers"), kw.pop("has_norm")
        norm = nn.LayerNorm((kw["d_model"],), epsilon=1e-5) if has_norm else None
        return nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), layers, norm)
    return getattr(nn, cls)(**kw)


def main(directory):
    out = {"cases": np.array(json.dumps(CASES))}
    for name, cls, kw, args, kwargs, values in CASES:
        rng = np.random.default_rng(sum(map(ord, name)) * 11)
        cell = build(cls, kw)
        cell.set_train(False)
        weights = cell.trainable_params()
        for p in weights:
            value = (rng.standard_normal(p.shape) * 0.4).astype(np.float32)
            p.set_data(ms.Tensor(value))
            out[f"{name}.{p.name}"] = value
        arrays = {k: v if v.dtype == bool else v.astype(np.float32) for k, v in inputs(rng).items()}
        used = sorted(set(args) | set(kwargs.values()))
        out.update({f"{name}.in.{k}": arrays[k] for k in used})
        diff = sorted({a for a in args if a.startswith("x")})
        tensors = {k: ms.Tensor(arrays[k]) for k in used}

        def call(*xs, cell=cell, args=args, kwargs=kwargs, values=values, diff=diff, tensors=tensors):
            given = dict(tensors, **dict(zip(diff, xs)))
            result = cell(*(given[a] for a in args), **{k: given[v] for k, v in kwargs.items()}, **values)
            return result if isinstance(result, tuple) else (result,)

        results = call(*(tensors[k] for k in diff))
        cotangents = [rng.standard_normal(r.shape).astype(np.float32) for r in results]
        for i, (r, c) in enumerate(zip(results, cotangents)):
            out[f"{name}.out{i}"], out[f"{name}.r{i}"] = r.asnumpy(), c

        def loss(*xs, call=call, cotangents=cotangents):
            return sum((r * ms.Tensor(c)).sum() for r, c in zip(call(*xs), cotangents))

        grad_position = tuple(range(len(diff)))
        _, (dxs, dweights) = ms.value_and_grad(loss, grad_position=grad_position, weights=weights)(
            *(tensors[k] for k in diff)
        )
        dxs = dxs if isinstance(dxs, tuple) else (dxs,)
        out.update({f"{name}.dx.{k}": g.asnumpy() for k, g in zip(diff, dxs)})
        out.update({f"{name}.d.{p.name}": g.asnumpy() for p, g in zip(weights, dweights)})
        print(name, [r.shape for r in results], flush=True)
    ms.set_seed(5)
    layer = nn.TransformerEncoderLayer(E, H, 16, activation="gelu", batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, nn.LayerNorm((E,), epsilon=1e-5))
    encoder.set_train(False)
    ms.save_checkpoint(encoder, f"{directory}/transformer_encoder.ckpt")
    out["ckpt.x"] = np.random.default_rng(5).standard_normal((N, L, E)).astype(np.float32)
    out["ckpt.y"] = encoder(ms.Tensor(out["ckpt.x"])).asnumpy()
    np.savez_compressed(f"{directory}/mindspore_transformer.npz", **out)


if __name__ == "__main__":
    main(sys.argv[1])
