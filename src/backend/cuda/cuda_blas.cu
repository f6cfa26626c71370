/* cuda_blas.cu: cuBLAS, opened with dlopen when a CUDA backend is created. Linking it would
 * load ~700 MB of libraries (cuBLAS + cuBLASLt) into every dflash process, CPU-only runs
 * included (about a second of start-up per CLI call); the few entry points used are looked up
 * once per backend instead. The library is searched as libcublas.so.<CUDA major> through the
 * executable's run path (set by the Makefile to the toolkit's lib64), then in DFL_CUDA_LIBDIR. */
#include "backend/cuda/cuda_common.cuh"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#ifndef DFL_CUDA_LIBDIR
#define DFL_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

#define BLAS_STR2(x) #x
#define BLAS_STR(x) BLAS_STR2(x)

dfl_status cuda_blas_load(cuda_blas_api *api, dfl_error *err) {
    memset(api, 0, sizeof(*api));
    char name[64], path[512];
    snprintf(name, sizeof(name), "libcublas.so.%d", CUBLAS_VER_MAJOR);
    snprintf(path, sizeof(path), "%s/%s", DFL_CUDA_LIBDIR, name);
    const char *tries[3] = {name, path, "libcublas.so"};
    for (int i = 0; i < 3 && api->lib == NULL; i++) api->lib = dlopen(tries[i], RTLD_NOW | RTLD_LOCAL);
    if (api->lib == NULL) {
        return error_set(err, DFL_ERR_UNSUPPORTED, "cuda backend: cannot load cuBLAS (%s, %s): %s", name, path, dlerror());
    }
#define SYM(field, sym)                                                                              \
    do {                                                                                             \
        api->field = (decltype(api->field))dlsym(api->lib, sym);                                     \
        if (api->field == NULL) {                                                                    \
            error_set(err, DFL_ERR_UNSUPPORTED, "cuda backend: cuBLAS (%s) has no %s", name, sym);  \
            cuda_blas_unload(api);                                                                   \
            return DFL_ERR_UNSUPPORTED;                                                              \
        }                                                                                            \
    } while (0)
    SYM(create, "cublasCreate_v2");
    SYM(destroy, "cublasDestroy_v2");
    SYM(set_stream, "cublasSetStream_v2");
    SYM(set_math_mode, "cublasSetMathMode");
    SYM(sgemm, "cublasSgemm_v2");
    SYM(gemm_ex, "cublasGemmEx");
    SYM(status_string, "cublasGetStatusString");
#undef SYM
    return DFL_OK;
}

void cuda_blas_unload(cuda_blas_api *api) {
    if (api->lib != NULL) dlclose(api->lib);
    memset(api, 0, sizeof(*api));
}
