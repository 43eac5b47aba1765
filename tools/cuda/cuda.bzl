"""cuda_library: .cu sources compiled by nvcc into objects that a cc_library wraps.

Bazel 4 has no CUDA rules and rules_cuda cannot be fetched offline (docs/BUILDING.md), so each
.cu file becomes one genrule that runs /usr/local/cuda/bin/nvcc. The flags are fixed here, in one
place, because they are part of the determinism contract (docs/SAMPLING.md):
  -fmad=false, -prec-div=true, -ftz=false: no fused multiply-add and IEEE division, so that the
      deterministic math of kernels/det_math.h returns the host's bits on the device;
  sm_90 machine code (H100), compute_90 PTX (JIT-compiled by newer GPUs), sm_80 (A100);
  -Xcompiler -fPIC: the objects may end up in shared libraries or position-independent binaries.
Objects are compiled without -rdc (whole-program per .cu file), so no device link step is needed.
The wrapping cc_library links the static CUDA runtime (//third_party:cudart_static), so binaries
carried to a GPU machine need no libcudart there, only the driver.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler",
    "-fPIC",
    "-Xcompiler",
    "-ffp-contract=off",
    "-fmad=false",
    "-prec-div=true",
    "-prec-sqrt=true",
    "-ftz=false",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
    "-gencode=arch=compute_80,code=sm_80",
    # CUB/Thrust have their own namespaces per translation unit; hides the symbol clash warnings
    # when several objects of one binary include them.
    "-DCUB_IGNORE_NAMESPACE_MAGIC_ERROR",
]

def cuda_library(name, srcs, hdrs = [], cuda_hdrs = [], deps = [], visibility = None, testonly = False):
    """A cc_library whose .cu sources are compiled by nvcc.

    Args:
      name: the cc_library's name.
      srcs: .cu files, each compiled to one object.
      hdrs: public headers of the library (plain C++, includable by host code).
      cuda_hdrs: every other header the .cu files include from the workspace (kernels/philox.h,
        private .cuh files): the genrules see only the files they are given.
      deps: cc_library dependencies of the wrapping library (header-only ones used by the .cu
        files must also be listed in cuda_hdrs).
      visibility: of the cc_library.
      testonly: of both.
    """
    objs = []
    for src in srcs:
        stem = src.replace("/", "_").rsplit(".", 1)[0]
        obj = "_%s_%s.pic.o" % (name, stem)
        native.genrule(
            name = "_%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + cuda_hdrs,
            outs = [obj],
            cmd = "%s %s -I. -I$(GENDIR) -c $(location %s) -o $@" % (NVCC, " ".join(NVCC_FLAGS), src),
            testonly = testonly,
            visibility = ["//visibility:private"],
        )
        objs.append(":" + obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["//third_party:cudart_static"],
        linkstatic = True,
        visibility = visibility,
        testonly = testonly,
    )
