"""Simple IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K quantizers (the gguf package only dequantizes these types),
and random blocks of the IQ1, IQ2 and IQ3 types at the input's scale (iq_random_blocks).

They only need to produce VALID blocks whose values approximate the input: the numerical
reference always uses gguf.quants.dequantize of the stored bytes, never these codes, so the
scale search is plain min/max rather than llama.cpp's optimised one. The block layouts follow
ggml-quants.c (dequantize_row_q2_K / q3_K / q4_K / q5_K / q6_K); test_reference_self_checks.py
round-trips them through gguf.quants.dequantize.
"""
from __future__ import annotations

import numpy as np

QK_K = 256


def _fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


IQ4_NL_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _iq4_nl_nibbles(b: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """[..., 32] values and [..., 1] scales -> [..., 16] bytes: each value's nearest level of
    value / scale (index 0 where the scale is 0), value j < 16 in the low nibble of byte j, j + 16
    in the high one."""
    scaled = np.where(scale != 0, b / np.where(scale != 0, scale, 1), 0)
    idx = np.abs(scaled[..., None] - IQ4_NL_LEVELS).argmin(axis=-1).astype(np.uint8)
    return idx[..., :16] | (idx[..., 16:] << 4)


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> [rows, cols/32*18] uint8. Block: d f16, qs[16]; value j = d*level[index],
    index j < 16 the low nibble of qs[j], j + 16 the high one. d puts the block's largest |x| on
    level -127 (its sign chosen so), each value on the nearest level."""
    rows, cols = x.shape
    assert cols % 32 == 0, f"IQ4_NL needs cols % 32 == 0, got {cols}"
    b = x.astype(np.float32).reshape(-1, 32)
    nb = b.shape[0]
    big = b[np.arange(nb), np.abs(b).argmax(axis=1)]
    d = _fp16(big / -127.0)
    qs = _iq4_nl_nibbles(b, d.astype(np.float32)[:, None])
    blocks = np.concatenate([d.reshape(nb, 1).view(np.uint8), qs], axis=1)
    return blocks.reshape(rows, cols // 32 * 18)


def quantize_iq4_xs(x: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> [rows, cols/256*136] uint8. Block: d f16, scales_h u16, scales_l[4],
    qs[128]; sub-block j (32 values) is IQ4_NL's with scale d*(ls_j-32), ls_j 6-bit: its low nibble
    in scales_l[j // 2] (the high one for odd j), its top two bits at bit 2j of scales_h; its
    indices in qs[16j:16j+16] as IQ4_NL's. Each sub-block's wanted scale puts its largest |x| on
    level -127 (as quantize_iq4_nl); d is the largest |wanted| / 31, each ls the nearest."""
    rows, cols = x.shape
    assert cols % QK_K == 0, f"IQ4_XS needs cols % 256 == 0, got {cols}"
    b = x.astype(np.float32).reshape(-1, 8, 32)
    nb = b.shape[0]
    big = np.take_along_axis(b, np.abs(b).argmax(axis=-1)[..., None], axis=-1)[..., 0]  # [nb, 8]
    want = big / -127.0
    d = _fp16(np.abs(want).max(axis=-1) / 31.0)  # [nb]
    d32 = d.astype(np.float32)[:, None]
    s = np.where(d32 != 0, np.clip(np.rint(want / np.where(d32 != 0, d32, 1)), -32, 31), 0).astype(np.int32)
    qs = _iq4_nl_nibbles(b, (d32 * s)[..., None]).reshape(nb, 128)
    ls = (s + 32).astype(np.uint16)  # [nb, 8]
    scales_h = np.zeros(nb, np.uint16)
    for j in range(8):
        scales_h |= (ls[:, j] >> 4) << (2 * j)
    low = (ls & 15).astype(np.uint8)
    scales_l = low[:, 0::2] | (low[:, 1::2] << 4)  # [nb, 4]
    blocks = np.concatenate([d.reshape(nb, 1).view(np.uint8), scales_h.reshape(nb, 1).view(np.uint8), scales_l, qs], axis=1)
    assert blocks.shape[1] == 136
    return blocks.reshape(rows, cols // QK_K * 136)


def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> [rows, cols/256*110] uint8. Block: hmask[32], qs[64], scales[12], d f16;
    value = d*(s[j]-32)*(q-4) for 16 sub-blocks j of 16 values, s 6-bit, q 3-bit: the low two bits
    of value 128h + 32p + l at bits 2p of qs[32h + l], the third at bit v // 32 of hmask[v % 32];
    s's low four bits in scales[j % 8] (high nibble for j >= 8), its top two at bits 2 (j // 4) of
    scales[8 + j % 4]."""
    rows, cols = x.shape
    assert cols % QK_K == 0, f"Q3_K needs cols % 256 == 0, got {cols}"
    b = x.astype(np.float32).reshape(-1, 16, 16)
    nb = b.shape[0]
    sub = np.maximum(b.max(axis=-1) / 3.0, -b.min(axis=-1) / 4.0)  # q - 4 in -4..3, never clipped
    d = _fp16(sub.max(axis=-1) / 31.0)
    d32 = d.astype(np.float32)[:, None]
    sc = np.where(d32 > 0, np.clip(np.rint(sub / np.where(d32 > 0, d32, 1)), 0, 31), 0).astype(np.int32)
    eff = (d32 * sc)[..., None]
    q = np.where(eff > 0, np.rint(b / np.where(eff > 0, eff, 1)), 0)
    q = (np.clip(q, -4, 3) + 4).astype(np.uint8).reshape(nb, 256)
    hmask = np.zeros((nb, 32), np.uint8)
    for k in range(8):
        hmask |= ((q[:, 32 * k:32 * k + 32] >> 2) & 1) << k
    qs = np.zeros((nb, 64), np.uint8)
    for h in range(2):
        for p in range(4):
            qs[:, 32 * h:32 * h + 32] |= (q[:, 128 * h + 32 * p:128 * h + 32 * p + 32] & 3) << (2 * p)
    s6 = (sc + 32).astype(np.uint8)
    scales = np.zeros((nb, 12), np.uint8)
    scales[:, 0:8] = (s6[:, 0:8] & 15) | ((s6[:, 8:16] & 15) << 4)
    for j in range(16):
        scales[:, 8 + j % 4] |= ((s6[:, j] >> 4) & 3) << (2 * (j // 4))
    blocks = np.concatenate([hmask, qs, scales, d.reshape(nb, 1).view(np.uint8)], axis=1)
    assert blocks.shape[1] == 110
    return blocks.reshape(rows, cols // QK_K * 110)


def _scales_mins_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins per super-block packed into 12 bytes (ggml's get_scale_min_k4)."""
    scales = np.zeros((sc.shape[0], 12), np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return scales


def _min_max_sub_blocks(x: np.ndarray, top: int, size: int = 32, scale_top: int = 63):
    """Q2_K / Q4_K / Q5_K's shared part: [rows, cols] -> sub-blocks of `size` values, 256 / size per
    super-block, with value = d*sc[j]*q - dmin*m[j], q in 0..top, sc and m in 0..scale_top.
    Returns (d, dmin, sc, m, q)."""
    b = x.astype(np.float32).reshape(-1, QK_K // size, size)
    lo = np.minimum(b.min(axis=-1), 0.0)  # [nb, 8]; offsets are >= 0 as in ggml
    hi = b.max(axis=-1)
    scale = (hi - lo) / float(top)
    offset = -lo
    d = _fp16(scale.max(axis=-1) / float(scale_top))  # [nb]
    dmin = _fp16(offset.max(axis=-1) / float(scale_top))
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.where(d32 > 0, np.clip(np.rint(scale / np.where(d32 > 0, d32, 1)), 0, scale_top), 0).astype(np.uint8)
    m = np.where(dmin32 > 0, np.clip(np.rint(offset / np.where(dmin32 > 0, dmin32, 1)), 0, scale_top), 0).astype(np.uint8)
    eff_scale = (d32 * sc)[..., None]
    eff_min = (dmin32 * m)[..., None]
    q = np.where(eff_scale > 0, np.rint((b + eff_min) / np.where(eff_scale > 0, eff_scale, 1)), 0)
    return d, dmin, sc, m, np.clip(q, 0, top).astype(np.uint8)  # q: [nb, 256 / size, size]


def quantize_q2_k(x: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> [rows, cols/256*84] uint8. Block: scales[16], qs[64], d f16, dmin f16;
    value = d*sc[j]*q - dmin*m[j] for 16 sub-blocks j of 16 values, sc (low nibble of scales[j])
    and m (high nibble) 4-bit, q 2-bit: value 128h + 32p + l at bits 2p of qs[32h + l]."""
    rows, cols = x.shape
    assert cols % QK_K == 0, f"Q2_K needs cols % 256 == 0, got {cols}"
    d, dmin, sc, m, q = _min_max_sub_blocks(x, 3, size=16, scale_top=15)
    nb = q.shape[0]
    q = q.reshape(nb, 256)
    qs = np.zeros((nb, 64), np.uint8)
    for h in range(2):
        for p in range(4):
            qs[:, 32 * h:32 * h + 32] |= q[:, 128 * h + 32 * p:128 * h + 32 * p + 32] << (2 * p)
    blocks = np.concatenate([sc | (m << 4), qs, d.reshape(nb, 1).view(np.uint8), dmin.reshape(nb, 1).view(np.uint8)], axis=1)
    assert blocks.shape[1] == 84
    return blocks.reshape(rows, cols // QK_K * 84)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> [rows, cols/256*144] uint8. Block: d f16, dmin f16, scales[12], qs[128];
    value = d*sc[j]*q - dmin*m[j] for 8 sub-blocks j of 32 values, sc/m 6-bit, q 4-bit."""
    rows, cols = x.shape
    assert cols % QK_K == 0, f"Q4_K needs cols % 256 == 0, got {cols}"
    d, dmin, sc, m, q = _min_max_sub_blocks(x, 15)
    nb = q.shape[0]
    # 64-value chunk j holds sub-block 2j in the low nibbles and 2j+1 in the high nibbles.
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(nb, 128)
    blocks = np.concatenate([d.reshape(nb, 1).view(np.uint8), dmin.reshape(nb, 1).view(np.uint8),
                             _scales_mins_k4(sc, m), qs], axis=1)
    assert blocks.shape[1] == 144
    return blocks.reshape(rows, cols // QK_K * 144)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> [rows, cols/256*176] uint8. Block: d f16, dmin f16, scales[12], qh[32],
    qs[128]; value = d*sc[j]*q - dmin*m[j] for 8 sub-blocks j of 32 values, q 5-bit: the nibble as
    Q4_K stores it, the fifth bit of value l of sub-block j as bit j of qh[l]."""
    rows, cols = x.shape
    assert cols % QK_K == 0, f"Q5_K needs cols % 256 == 0, got {cols}"
    d, dmin, sc, m, q = _min_max_sub_blocks(x, 31)
    nb = q.shape[0]
    low = q & 0xF
    qs = (low[:, 0::2, :] | (low[:, 1::2, :] << 4)).reshape(nb, 128)
    qh = np.zeros((nb, 32), np.uint8)
    for j in range(8):
        qh |= ((q[:, j, :] >> 4) & 1) << j
    blocks = np.concatenate([d.reshape(nb, 1).view(np.uint8), dmin.reshape(nb, 1).view(np.uint8),
                             _scales_mins_k4(sc, m), qh, qs], axis=1)
    assert blocks.shape[1] == 176
    return blocks.reshape(rows, cols // QK_K * 176)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> [rows, cols/256*210] uint8. Block: ql[128], qh[64], scales[16] int8, d f16;
    value = d*scale[j]*(q-32) for 16 sub-blocks j of 16 values, q 6-bit."""
    rows, cols = x.shape
    assert cols % QK_K == 0, f"Q6_K needs cols % 256 == 0, got {cols}"
    b = x.astype(np.float32).reshape(-1, 16, 16)
    nb = b.shape[0]
    sub = np.abs(b).max(axis=-1) / 31.0  # [nb, 16]
    d = _fp16(sub.max(axis=-1) / 127.0)
    d32 = d.astype(np.float32)[:, None]
    sc = np.where(d32 > 0, np.clip(np.rint(sub / np.where(d32 > 0, d32, 1)), 0, 127), 0).astype(np.int8)
    eff = (d32 * sc)[..., None]
    q = np.where(eff > 0, np.rint(b / np.where(eff > 0, eff, 1)), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(nb, 2, 4, 32)  # [block, half, quarter, l]

    # In each 128-value half: ql[l] = v[l] | v[l+64] << 4, ql[l+32] = v[l+32] | v[l+96] << 4,
    # qh[l] = bits 4-5 of v[l], v[l+32], v[l+64], v[l+96] at shifts 0, 2, 4, 6.
    lo = q & 0xF
    hi = q >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)  # [nb, 2, 64]
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)  # [nb, 2, 32]
    blocks = np.concatenate(
        [ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8), d.reshape(nb, 1).view(np.uint8)], axis=1)
    assert blocks.shape[1] == 210
    return blocks.reshape(rows, cols // QK_K * 210)


# Roughly the mean |value| / d of a random block of each IQ1-IQ3 type (scale 0.5-15.5 times the
# grid's mean magnitude), so that d = rms(x) / this gives values at the input's scale.
_IQ_MAGNITUDE = {"IQ2_XXS": 50.0, "IQ2_XS": 50.0, "IQ2_S": 50.0, "IQ3_XXS": 120.0, "IQ3_S": 128.0, "IQ1_S": 6.0, "IQ1_M": 6.0}
IQ_RANDOM_TYPES = frozenset(_IQ_MAGNITUDE)


def iq_random_blocks(x: np.ndarray, type_name: str) -> np.ndarray:
    """[rows, cols] float -> [rows, cols/256*size] uint8: blocks of an IQ1, IQ2 or IQ3 type with
    random grid indices, signs and scales (from a generator seeded by x's bytes) and each block's
    fp16 d set so that its values have about x's scale there. They do not approximate x (no
    quantizer for these types here or in the gguf package); they are valid blocks, which is all the
    numerical tests need, since their reference dequantizes the stored bytes with gguf's code."""
    import zlib
    import gguf
    t = gguf.GGMLQuantizationType[type_name]
    block, size = gguf.GGML_QUANT_SIZES[t]
    rows, cols = x.shape
    assert cols % block == 0, f"{type_name} needs cols % {block} == 0, got {cols}"
    xb = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, block)
    rng = np.random.default_rng(zlib.crc32(xb.tobytes()) ^ int(t))
    out = rng.integers(0, 256, size=(xb.shape[0], size), dtype=np.uint8)
    d = (np.sqrt((xb.astype(np.float64) ** 2).mean(axis=1)) / _IQ_MAGNITUDE[type_name] + 1e-8).astype(np.float16)
    if type_name == "IQ1_M":  # d's four nibbles on top of the four scale words (bytes 48..55)
        words = out[:, 48:56].copy().view(np.uint16)
        bits = d.view(np.uint16)
        for k in range(4):
            words[:, k] = (words[:, k] & 0x0FFF) | (((bits >> (4 * k)) & 15) << 12)
        out[:, 48:56] = words.view(np.uint8)
    else:
        out[:, 0:2] = d.reshape(-1, 1).view(np.uint8)
    return out.reshape(rows, cols // block * size)


_QUANTIZERS = {"Q2_K": quantize_q2_k, "IQ4_NL": quantize_iq4_nl, "IQ4_XS": quantize_iq4_xs, "Q3_K": quantize_q3_k, "Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k,
               "Q6_K": quantize_q6_k}


def encode(w: np.ndarray, type_name: str):
    """(array to write, raw_dtype) for GGUFWriter.add_tensor: F32 and F16 as arrays (raw_dtype None),
    the types above by this module's quantizers, the others by the gguf package's. Raises
    ValueError for a type neither has a quantizer for (the IQ2 and IQ3 types, say)."""
    import gguf
    if type_name == "F32":
        return np.ascontiguousarray(w, dtype=np.float32), None
    if type_name == "F16":
        return np.ascontiguousarray(w, dtype=np.float16), None
    t = gguf.GGMLQuantizationType[type_name]
    if type_name in _QUANTIZERS:
        return _QUANTIZERS[type_name](w), t
    if type_name in IQ_RANDOM_TYPES:
        return iq_random_blocks(w, type_name), t
    try:
        return gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), t), t
    except NotImplementedError:
        raise ValueError(f"no {type_name} quantizer (neither kquants.py nor the gguf package has one)") from None
