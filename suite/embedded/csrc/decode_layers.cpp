// The layers of one decode step (suite/embedded/decode.py, DecodeLayer) as one C++ call.
//
// Not new arithmetic: every line below is the aten call the Python DecodeLayer makes, with the
// same arguments in the same order (at::mm_out for mm(..., out=), at::baddbmm for baddbmm,
// Tensor * double for `tensor * float`, ...), so every kernel, and so every bit, is the same
// (tests/embedded/test_decode.py runs both). One exception, the same bits too: the W8A8 linears that
// read one input (q|k|v, gate|up) run as one integer GEMM, whose exact sums are each linear's (below,
// kNorms). What goes away is the Python around ~40 aten
// calls and ~60 views per layer: argument parsing, tensor wrapping and the interpreter, a few
// microseconds each at decode batch sizes, where one call computes little.
// Covered: plain (bias-free) linears or the fused W8A8 ones (suite_fused::quant_rows and
// mm_rescale, the calls qlinear.Int8Linear makes, its input quantized once per group of linears
// that read it, as SharedActQuant does), the float32 attention (baddbmm), the native 16-bit
// one (bmm over the whole cache) and the emulated bf16 one (float32 matmuls rounded to bf16,
// qlinear.bf16_matmul_emulated: CPUs without bf16 kernels). The other engines keep the Python loop.

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/extension.h>

#include <tuple>
#include <vector>

namespace {

using at::Tensor;

// decode.Norm: RMSNorm on rows, float32 statistics.
Tensor norm(const Tensor& x, const Tensor& w, const Tensor& n, const Tensor& eps, bool f32) {
  Tensor xf = f32 ? x : x.to(at::kFloat);
  Tensor r = (xf * xf).sum({-1}, /*keepdim=*/true).div_(n).add_(eps).rsqrt_();
  if (f32) return (x * r).mul_(w);
  return xf.mul_(r).to(x.scalar_type()).mul_(w);
}

// decode.rotate: qk [2, M, D] -> qk * cos + swap(qk) * sin.
Tensor rotate(const Tensor& qk, const Tensor& cos, const Tensor& sin, int64_t n_heads, const Tensor& swap) {
  const int64_t two = qk.size(0), M = qk.size(1), D = qk.size(2), hd = D / n_heads;
  Tensor rot = qk.view({two, M, n_heads, 2, hd / 2}).index_select(3, swap).view({two, M, D});
  return (qk * cos).add_(rot.mul_(sin));
}

// Per layer, `w` holds attn_norm (weight, n, eps), mlp_norm (weight, n, eps), then for each of
// wq, wk, wv, wo, w_gate, w_up, w_down its transposed [K, N] weight view (plain), or (int8) for
// each of q|k|v, wo, gate|up, w_down one GEMM operand (int8 codes' [K, N] view or the packed
// weight: qlinear.share_operands / Int8Linear.gemm_weight) and its float32 scales [1, N]: the
// linears that read one input share one integer GEMM, whose exact sums, split by columns, are
// each linear's, so the same bits as the Python loop's separate calls.
constexpr size_t kNorms = 6;
enum Int8Gemm { kQKV = 0, kO = 1, kGateUp = 2, kDown = 3 };

// The fused W8A8 ops of the suite_fused library (csrc/int8_linear.cpp, loaded by Python first).
struct Int8Ops {
  c10::TypedOperatorHandle<std::tuple<Tensor, Tensor, bool>(const Tensor&)> quant;
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, c10::ScalarType)> mm;
  static const Int8Ops& get() {
    static const Int8Ops ops{
        c10::Dispatcher::singleton().findSchemaOrThrow("suite_fused::quant_rows", "")
            .typed<std::tuple<Tensor, Tensor, bool>(const Tensor&)>(),
        c10::Dispatcher::singleton().findSchemaOrThrow("suite_fused::mm_rescale", "")
            .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, c10::ScalarType)>()};
    return ops;
  }
};

// A quantized activation (codes, scales) or, for plain linears, the activation itself.
struct Act {
  Tensor x, codes, scales;
};

// decode.Decoder's layer loop: x [B, D] updated in place. Returns (x, undefined), or, where an
// int8 activation had a non-finite value, (x, that activation) at once: the caller raises the
// quantizer's own error on it, as fused.quant_rows does.
std::tuple<Tensor, Tensor> layers(Tensor x, const std::vector<Tensor>& w, const std::vector<Tensor>& kv, int64_t s0,
                                  const Tensor& cos, const Tensor& sin, const Tensor& bias, const Tensor& qk_buf,
                                  const Tensor& q_out, const Tensor& k_out, const Tensor& p, const Tensor& swap,
                                  int64_t n_heads, double scale, bool scale_exact, bool full_att, bool emu_att,
                                  bool f32, bool int8) {
  const size_t L = kv.size() / 2, per_layer = kNorms + (int8 ? 8 : 7);
  TORCH_CHECK(w.size() == L * per_layer, "decode_layers: ", w.size(), " weights for ", L, " layers");
  const int64_t B = x.size(0), D = x.size(1), hd = D / n_heads, S = s0 + 1;
  const Int8Ops* ops = int8 ? &Int8Ops::get() : nullptr;
  Tensor bad;  // set: the non-finite activation
  // SharedActQuant: an input quantized once for all the linears that read it.
  auto act = [&](const Tensor& a) -> Act {
    if (!int8) return {a, {}, {}};
    auto [codes, scales, finite] = ops->quant.call(a);
    if (!finite) bad = a;
    return {a, codes, scales};
  };
  // plain linear i (0 = wq .. 6 = w_down) of layer lw on the activation a: [M, N].
  auto linear = [&](const Tensor* lw, int i, const Act& a) -> Tensor { return at::mm(a.x, lw[kNorms + i]); };
  // int8 GEMM g (Int8Gemm) of layer lw on the quantized activation a: [M, N of the group].
  auto gemm8 = [&](const Tensor* lw, Int8Gemm g, const Act& a) -> Tensor {
    return ops->mm.call(a.codes, lw[kNorms + 2 * g], a.scales, lw[kNorms + 2 * g + 1], a.x.scalar_type());
  };
  for (size_t l = 0; l < L; ++l) {
    const Tensor* lw = w.data() + l * per_layer;
    const Tensor& kc = kv[2 * l];
    const Tensor& vc = kv[2 * l + 1];
    Tensor h = norm(x, lw[0], lw[1], lw[2], f32);
    Act ha = act(h);
    if (bad.defined()) return {x, bad};
    Tensor qk_in, v;
    if (int8) {
      // [B, 3D] -> q and k as [2, B, D] (a copy, as the Python loop's stack), v a [B, D] view
      Tensor qkv = gemm8(lw, kQKV, ha);
      qk_in = qkv.narrow(1, 0, 2 * D).view({B, 2, D}).transpose(0, 1).contiguous();
      v = qkv.narrow(1, 2 * D, D);
    } else {
      at::mm_out(const_cast<Tensor&>(q_out), h, lw[kNorms + 0]);
      at::mm_out(const_cast<Tensor&>(k_out), h, lw[kNorms + 1]);
      qk_in = qk_buf;
      v = linear(lw, 2, ha);
    }
    Tensor qk = rotate(qk_in, cos, sin, n_heads, swap);
    kc.select(1, s0).copy_(qk.select(0, 1).view({B * n_heads, hd}));
    vc.select(1, s0).view({B, n_heads, hd}).copy_(v.view({B, n_heads, hd}));
    Tensor q = qk.select(0, 0).view({B * n_heads, 1, hd});
    Tensor y;
    if (full_att) {
      Tensor att = at::bmm(q, kc.transpose(1, 2)).slice(2, 0, S) * scale + bias;
      p.slice(2, 0, S).copy_(at::softmax(att, -1, at::kFloat));
      y = at::bmm(p, vc);
    } else if (emu_att) {  // DecodeLayer.attend with matmul = qlinear.bf16_matmul_emulated
      Tensor kt = kc.slice(1, 0, S).transpose(1, 2);
      const auto bf16 = at::kBFloat16;
      Tensor att = at::matmul(q.to(at::kFloat), kt.to(at::kFloat)).to(bf16) * scale + bias;
      att = at::softmax(att, -1, at::kFloat).to(bf16);  // the cache may hold bf16 values in float32
      y = at::matmul(att.to(at::kFloat), vc.slice(1, 0, S).to(at::kFloat)).to(bf16);
    } else {
      Tensor kt = kc.slice(1, 0, S).transpose(1, 2);
      Tensor att = scale_exact ? at::baddbmm(bias, q, kt, 1, scale) : at::baddbmm(bias, q, kt).mul_(scale);
      y = at::bmm(at::softmax(att, -1), vc.slice(1, 0, S));
    }
    Act ya = act(y.view({B, D}));
    if (bad.defined()) return {x, bad};
    x.add_(int8 ? gemm8(lw, kO, ya) : linear(lw, 3, ya));
    Tensor h2 = norm(x, lw[3], lw[4], lw[5], f32);
    Act h2a = act(h2);
    if (bad.defined()) return {x, bad};
    Tensor g;
    if (int8) {  // [B, 2F]: silu of the gate half into a fresh [B, F], times the up half
      Tensor gu = gemm8(lw, kGateUp, h2a);
      const int64_t F = gu.size(1) / 2;
      g = at::silu(gu.narrow(1, 0, F));
      g.mul_(gu.narrow(1, F, F));
    } else {
      g = linear(lw, 4, h2a);
      at::silu_(g);
      g.mul_(linear(lw, 5, h2a));
    }
    Act ga = act(g);
    if (bad.defined()) return {x, bad};
    x.add_(int8 ? gemm8(lw, kDown, ga) : linear(lw, 6, ga));
  }
  return {x, bad};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("layers", &layers, "the layers of one decode step (suite.embedded.decode)");
}
