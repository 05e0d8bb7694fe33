"""Four floats per load or store moved as 64-bit words: the one wide-access helper of every kernel family.

Mesa 22's lavapipe loads and stores storage buffers one component per invocation in a scalar loop (with a
store-forwarding stall per component), so a vec4 of 32-bit values moved as two u64 components costs about
half as much as four f32 components (measured 1.8x less CPU per element). On GPUs the f32 vec4 access is
the natural 128-bit load, so wide ("u64x2") variants are lavapipe variants.

A bf16 or fp16 vec4 is 8 bytes: one u64 word, unpacked in registers by shifts (a bf16 is the top half of
an f32) or GLSL UnpackHalf2x16 (fp16, exact), and packed after rounding. Maps (elementwise.py), row kernels
(lib/row_workers.py, rows/reduce.py), matmul (matmul/common.py) and attention read and write through `WideView`.
"""

from __future__ import annotations

from helios.spirv import KernelBuilder, ScalarType, Value, f32, u32, u64, vec
from helios.spirv.memory import bf16_bits

U64X2 = vec(u64, 2)


def unpack_half4(b: KernelBuilder, word: Value, dtype: str) -> Value:
    """The vec4<f32> of the 4 halves (bf16 or fp16, lowest address first) in a u64 word; exact."""
    lo_hi = b.bitcast(word, vec(u32, 2))
    lo, hi = lo_hi[0], lo_hi[1]
    if dtype == "fp16":
        a, c = (b.glsl("UnpackHalf2x16", w, result=vec(f32, 2)) for w in (lo, hi))
        return b.vector(a[0], a[1], c[0], c[1])
    return b.bitcast(b.vector(lo << 16, lo & 0xFFFF0000, hi << 16, hi & 0xFFFF0000), vec(f32, 4))


def pack_half4(b: KernelBuilder, value: Value, dtype: str) -> Value:
    """A vec4<f32> rounded to 4 halves (bf16 or fp16) packed in one u64 word (unpack_half4's inverse)."""
    if dtype == "fp16":
        lo, hi = (b.glsl("PackHalf2x16", b.vec2(value[j], value[j + 1]), result=u32) for j in (0, 2))
        return b.bitcast(b.vector(lo, hi), u64)
    r = bf16_bits(b, value)
    return b.bitcast(b.vector(r[0] | (r[1] << 16), r[2] | (r[3] << 16)), u64)


class WideView:
    """vec4 elements of `buf` moved as 64-bit words: two per vec4 of 32-bit values (`dtype` "f32"; `elem` says
    which 32-bit type they are), one per vec4 of halves (`dtype` "bf16" or "fp16", widened to vec4<f32>).
    `buf` may be declared as u64 or as the stored type; the words are a view of the same binding."""

    def __init__(self, b: KernelBuilder, buf, dtype: str = "f32", elem: ScalarType = f32) -> None:
        self.b, self.dtype, self.elem = b, dtype, vec(elem, 4)
        self.half = dtype != "f32"
        self.words = buf.view_as(u64 if self.half else U64X2)

    def __getitem__(self, k) -> Value:
        if self.half:
            return unpack_half4(self.b, self.words[k], self.dtype)
        return self.b.bitcast(self.words[k], self.elem)

    def __setitem__(self, k, value: Value) -> None:
        self.words[k] = pack_half4(self.b, value, self.dtype) if self.half else self.b.bitcast(value, U64X2)
