/* The rehearsal's stand-in for the NVIDIA driver's libcuda.so.1 (tests/standins; built and bind-mounted into the
 * container by the recording nvidia-container-cli, tests/enrootpyxis.py). It exists so that what dlopens libcuda
 * inside an image (libfabric's CUDA HMEM, NCCL, torch) finds the SONAME where the real driver's would be; every
 * entry point answers as a driver on a host without a GPU does: CUDA_ERROR_NO_DEVICE (100). It never claims a
 * driver version or a device. */
typedef int CUresult;
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_NOT_FOUND 500

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDriverGetVersion(int *v) { if (v) *v = 0; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDeviceGetCount(int *n) { if (n) *n = 0; return CUDA_ERROR_NO_DEVICE; }
CUresult cuGetProcAddress(const char *s, void **p, int v, unsigned long long f) {
    (void)s; (void)v; (void)f; if (p) *p = 0; return CUDA_ERROR_NOT_FOUND; }
CUresult cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, void *st) {
    (void)s; (void)v; (void)f; (void)st; if (p) *p = 0; return CUDA_ERROR_NOT_FOUND; }
CUresult cuGetErrorString(CUresult e, const char **s) {
    (void)e; if (s) *s = "reprostack rehearsal stub libcuda: no NVIDIA driver on this host"; return 0; }
