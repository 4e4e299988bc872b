// Harness host program (host C++, built with `nvcc -x c++`): loads one candidate library and runs it under the harness's control.
//
//   runner <candidate.so> <job_dir> <reply_fd>
//
// job_dir/job.txt (written by the parent):
//   inputs K
//   bytes b_0 ... b_{K-1} b_out
//   dims D d_0 ... d_{D-1}
//   trials T
// with input files job_dir/in_<t>_<k>.bin (set t, input k). The harness owns every allocation, the one
// (blocking) stream, synchronisation and timing; the candidate only sees
//   kernels_eval_call(void* const* buffers, const int* dims, cudaStream_t stream).
//
// Commands on stdin, one reply line each on <reply_fd> (never stdout, which the candidate shares):
//   check      T trials: poison the output (0xFF bytes = NaN), call, sync, write out_<t>.bin, compare
//              inputs against their pristine copies; then call trial 0 again into det.bin.
//              -> "ok check launches=<n> foreign_streams=<n> mutated=<t:k,...|->"
//   time N W R the one timing method of the evaluator (`kernels_eval.timing` times JAX code the same way).
//              prep(i): restore the inputs of set i % T from their pristine device copies (device-to-device),
//              poison the output (0xFF), flush L2 (memset of a buffer twice the L2 size). W warm-up calls
//              [prep(i); call(i)], then R rounds of
//                base = device time of N x [prep(i)],  full = device time of N x [prep(i); call(i)],
//                ms_r = (full - base) / N,
//              each loop measured by CUDA events recorded on the harness stream right before and after it,
//              behind a head start (N flushes enqueued before the first event) so that the host's enqueueing
//              never leaves the device idle inside a loop. The prep-only loop comes first in a round, so the
//              output left at the end is that of the last timed call, on set (N - 1) % T (the parent picks N
//              so that this is set 0); it is written to timed.bin.
//              -> "ok time set=<(N-1) % T> ms=<ms_0>,...,<ms_{R-1}>"
//   quit
// A CUDA error replies "cuda_error <phase> <trial> <name>: <message> | last launch grid=(..) block=(..)
// smem=<bytes>" and exits with status 3: the process is not reused after an error.
//
// Kernel launches are observed by interposing every launch entry point of the CUDA 13 runtime that a
// candidate can import: __cudaLaunchKernel (`<<<>>>`), cudaLaunchKernel, cudaLaunchKernelExC (the
// `cudaLaunchKernelEx` template) and their per-thread-default-stream `_ptsz` twins (what the same code
// imports under CUDA_API_PER_THREAD_DEFAULT_STREAM). They are exported from this executable, so the
// candidate's imports bind here first, and forward to the runtime; the symbol audit refuses any other
// launch API (`audit.OBSERVED_LAUNCHES`).
//
// With KERNELS_EVAL_HARNESS_PARENT=<pid> in the environment the harness dies with that parent: it sets
// PR_SET_PDEATHSIG (SIGKILL) and exits at once when its parent is no longer that pid.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct LaunchLog {
  long launches = 0;
  long foreign_streams = 0;
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t expected = nullptr;
};
LaunchLog g_log;

void Record(dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
  g_log.launches++;
  g_log.grid = grid;
  g_log.block = block;
  g_log.smem = smem;
  if (stream != g_log.expected) g_log.foreign_streams++;
}

template <typename Fn>
Fn Next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

typedef cudaError_t (*InternalLaunchFn)(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t);
typedef cudaError_t (*PublicLaunchFn)(const void*, dim3, dim3, void**, size_t, cudaStream_t);
typedef cudaError_t (*ExLaunchFn)(const cudaLaunchConfig_t*, const void*, void**);

cudaError_t RecordEx(ExLaunchFn next, const cudaLaunchConfig_t* config, const void* func, void** args) {
  if (config != nullptr) Record(config->gridDim, config->blockDim, config->dynamicSmemBytes, config->stream);
  return next(config, func, args);
}

}  // namespace

#define KERNELS_EVAL_EXPORT extern "C" __attribute__((visibility("default")))

KERNELS_EVAL_EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                                   size_t smem, cudaStream_t stream) {
  static InternalLaunchFn next = Next<InternalLaunchFn>("__cudaLaunchKernel");
  Record(grid, block, smem, stream);
  return next(kernel, grid, block, args, smem, stream);
}

KERNELS_EVAL_EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                                        size_t smem, cudaStream_t stream) {
  static InternalLaunchFn next = Next<InternalLaunchFn>("__cudaLaunchKernel_ptsz");
  Record(grid, block, smem, stream);
  return next(kernel, grid, block, args, smem, stream);
}

KERNELS_EVAL_EXPORT cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t smem,
                                                 cudaStream_t stream) {
  static PublicLaunchFn next = Next<PublicLaunchFn>("cudaLaunchKernel");
  Record(grid, block, smem, stream);
  return next(func, grid, block, args, smem, stream);
}

KERNELS_EVAL_EXPORT cudaError_t cudaLaunchKernel_ptsz(const void* func, dim3 grid, dim3 block, void** args,
                                                      size_t smem, cudaStream_t stream) {
  static PublicLaunchFn next = Next<PublicLaunchFn>("cudaLaunchKernel_ptsz");
  Record(grid, block, smem, stream);
  return next(func, grid, block, args, smem, stream);
}

KERNELS_EVAL_EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func,
                                                    void** args) {
  static ExLaunchFn next = Next<ExLaunchFn>("cudaLaunchKernelExC");
  return RecordEx(next, config, func, args);
}

KERNELS_EVAL_EXPORT cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func,
                                                         void** args) {
  static ExLaunchFn next = Next<ExLaunchFn>("cudaLaunchKernelExC_ptsz");
  return RecordEx(next, config, func, args);
}

namespace {

typedef void (*EntryFn)(void* const*, const int*, cudaStream_t);

int g_reply_fd = -1;

void Reply(const std::string& line) {
  std::string out = line + "\n";
  if (write(g_reply_fd, out.data(), out.size()) < 0) std::exit(4);
}

void Fail(const char* phase, int trial, cudaError_t err) {
  std::ostringstream s;
  s << "cuda_error " << phase << " " << trial << " " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err)
    << " | last launch grid=(" << g_log.grid.x << "," << g_log.grid.y << "," << g_log.grid.z << ") block=("
    << g_log.block.x << "," << g_log.block.y << "," << g_log.block.z << ") smem=" << g_log.smem
    << " launches=" << g_log.launches;
  Reply(s.str());
  std::exit(3);
}

void Check(cudaError_t err, const char* phase, int trial) {
  if (err != cudaSuccess) Fail(phase, trial, err);
}

void DieWithParent() {
  const char* parent = std::getenv("KERNELS_EVAL_HARNESS_PARENT");
  if (parent == nullptr) return;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != std::atoi(parent)) std::exit(6);  // the parent died before the line above
}

std::vector<char> ReadFile(const std::string& path, size_t bytes) {
  std::vector<char> data(bytes);
  std::ifstream f(path, std::ios::binary);
  if (!f.read(data.data(), static_cast<std::streamsize>(bytes))) {
    Reply("harness_error cannot read " + path);
    std::exit(2);
  }
  return data;
}

void WriteFile(const std::string& path, const std::vector<char>& data) {
  std::ofstream f(path, std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!f) {
    Reply("harness_error cannot write " + path);
    std::exit(2);
  }
}

struct Job {
  int n_inputs = 0, n_trials = 0;
  std::vector<size_t> in_bytes;
  size_t out_bytes = 0;
  std::vector<int> dims;
};

Job ReadJob(const std::string& dir) {
  Job job;
  std::ifstream f(dir + "/job.txt");
  std::string key;
  while (f >> key) {
    if (key == "inputs") {
      f >> job.n_inputs;
    } else if (key == "bytes") {
      job.in_bytes.resize(job.n_inputs);
      for (auto& b : job.in_bytes) f >> b;
      f >> job.out_bytes;
    } else if (key == "dims") {
      int d = 0;
      f >> d;
      job.dims.resize(d);
      for (auto& v : job.dims) f >> v;
    } else if (key == "trials") {
      f >> job.n_trials;
    }
  }
  if (job.n_inputs <= 0 || job.n_trials <= 0 || job.out_bytes == 0 ||
      static_cast<int>(job.in_bytes.size()) != job.n_inputs) {
    Reply("harness_error malformed job.txt in " + dir);
    std::exit(2);
  }
  return job;
}

// Device buffers of one job: per input set the buffers the candidate sees (inputs, then the one shared
// output) and pristine copies of the inputs, on the device and on the host.
class Harness {
 public:
  Harness(const Job& job, const std::string& dir, EntryFn entry) : job_(job), dir_(dir), entry_(entry) {}

  void Setup() {
    Check(cudaStreamCreate(&stream_), "setup", -1);
    g_log.expected = stream_;
    int l2_bytes = 0;
    Check(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0), "setup", -1);
    flush_bytes_ = 2 * static_cast<size_t>(l2_bytes > 0 ? l2_bytes : (64 << 20));
    Check(cudaMalloc(&flush_, flush_bytes_), "setup", -1);
    Check(cudaMalloc(&out_, job_.out_bytes), "setup", -1);
    host_.resize(job_.n_trials);
    dev_.assign(job_.n_trials, std::vector<void*>(job_.n_inputs + 1, out_));
    pristine_.assign(job_.n_trials, std::vector<void*>(job_.n_inputs, nullptr));
    for (int t = 0; t < job_.n_trials; ++t) {
      for (int k = 0; k < job_.n_inputs; ++k) {
        const size_t bytes = job_.in_bytes[k];
        host_[t].push_back(ReadFile(dir_ + "/in_" + std::to_string(t) + "_" + std::to_string(k) + ".bin", bytes));
        Check(cudaMalloc(&dev_[t][k], bytes), "setup", t);
        Check(cudaMalloc(&pristine_[t][k], bytes), "setup", t);
        Check(cudaMemcpy(dev_[t][k], host_[t][k].data(), bytes, cudaMemcpyHostToDevice), "setup", t);
        Check(cudaMemcpy(pristine_[t][k], dev_[t][k], bytes, cudaMemcpyDeviceToDevice), "setup", t);
      }
    }
    Check(cudaDeviceSynchronize(), "setup", -1);
  }

  // Every trial into out_<t>.bin, the inputs compared with their pristine copies, trial 0 again into det.bin.
  void RunCheck() {
    std::string mutated;
    for (int t = 0; t < job_.n_trials; ++t) {
      Poison(t, "check");
      Call(t, "check");
      Check(cudaDeviceSynchronize(), "check", t);
      WriteFile(dir_ + "/out_" + std::to_string(t) + ".bin", Download(t, "check"));
      bool changed = false;
      for (int k = 0; k < job_.n_inputs; ++k) {
        std::vector<char> now(job_.in_bytes[k]);
        Check(cudaMemcpy(now.data(), dev_[t][k], job_.in_bytes[k], cudaMemcpyDeviceToHost), "check", t);
        if (now != host_[t][k]) {
          mutated += (mutated.empty() ? "" : ",") + std::to_string(t) + ":" + std::to_string(k);
          changed = true;
        }
      }
      if (changed) Restore(t, "check");
    }
    Poison(0, "determinism");
    Call(0, "determinism");
    Check(cudaDeviceSynchronize(), "determinism", 0);
    WriteFile(dir_ + "/det.bin", Download(0, "determinism"));
    Reply("ok check launches=" + std::to_string(g_log.launches) + " foreign_streams=" +
          std::to_string(g_log.foreign_streams) + " mutated=" + (mutated.empty() ? "-" : mutated));
  }

  // The `time N W R` command (method in the header comment).
  void RunTime(int n, int warmup, int rounds) {
    Check(cudaEventCreate(&start_), "time", -1);
    Check(cudaEventCreate(&stop_), "time", -1);
    for (int i = 0; i < warmup; ++i) {
      Prep(i, "warmup");
      Call(i % job_.n_trials, "warmup");
    }
    Check(cudaDeviceSynchronize(), "warmup", -1);
    std::ostringstream ms;
    for (int r = 0; r < rounds; ++r) {
      const float base = LoopMs(n, false);
      const float full = LoopMs(n, true);
      ms << (r ? "," : "") << (full - base) / n;
    }
    const int last = (n - 1) % job_.n_trials;
    WriteFile(dir_ + "/timed.bin", Download(last, "time"));
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    Reply("ok time set=" + std::to_string(last) + " ms=" + ms.str());
  }

 private:
  void Restore(int t, const char* phase) {
    for (int k = 0; k < job_.n_inputs; ++k) {
      Check(cudaMemcpyAsync(dev_[t][k], pristine_[t][k], job_.in_bytes[k], cudaMemcpyDeviceToDevice, stream_),
            phase, t);
    }
  }

  void Poison(int t, const char* phase) { Check(cudaMemsetAsync(out_, 0xFF, job_.out_bytes, stream_), phase, t); }

  void Flush(int i, const char* phase) { Check(cudaMemsetAsync(flush_, i & 0xFF, flush_bytes_, stream_), phase, -1); }

  // prep(i): fresh inputs of set i % T, a poisoned output, a cold L2.
  void Prep(int i, const char* phase) {
    const int t = i % job_.n_trials;
    Restore(t, phase);
    Poison(t, phase);
    Flush(i, phase);
  }

  void Call(int t, const char* phase) {
    entry_(dev_[t].data(), job_.dims.data(), stream_);
    Check(cudaGetLastError(), phase, t);
  }

  // Device time of n x [prep(i); call(i) when with_call], between events on the harness stream.
  float LoopMs(int n, bool with_call) {
    Check(cudaDeviceSynchronize(), "time", -1);
    for (int i = 0; i < n; ++i) Flush(i, "time");  // head start
    Check(cudaEventRecord(start_, stream_), "time", -1);
    for (int i = 0; i < n; ++i) {
      Prep(i, "time");
      if (with_call) Call(i % job_.n_trials, "time");
    }
    Check(cudaEventRecord(stop_, stream_), "time", -1);
    Check(cudaEventSynchronize(stop_), "time", -1);
    Check(cudaGetLastError(), "time", -1);
    float elapsed = 0.f;
    Check(cudaEventElapsedTime(&elapsed, start_, stop_), "time", -1);
    return elapsed;
  }

  std::vector<char> Download(int t, const char* phase) {
    std::vector<char> data(job_.out_bytes);
    Check(cudaMemcpy(data.data(), out_, job_.out_bytes, cudaMemcpyDeviceToHost), phase, t);
    return data;
  }

  const Job& job_;
  const std::string dir_;
  const EntryFn entry_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  void* flush_ = nullptr;
  size_t flush_bytes_ = 0;
  void* out_ = nullptr;
  std::vector<std::vector<std::vector<char>>> host_;
  std::vector<std::vector<void*>> dev_;
  std::vector<std::vector<void*>> pristine_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <candidate.so> <job_dir> <reply_fd>\n", argv[0]);
    return 2;
  }
  DieWithParent();
  g_reply_fd = std::atoi(argv[3]);
  const std::string dir = argv[2];
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    Reply(std::string("load_error ") + dlerror());
    return 2;
  }
  EntryFn entry = reinterpret_cast<EntryFn>(dlsym(lib, "kernels_eval_call"));
  if (entry == nullptr) {
    Reply("load_error kernels_eval_call not found");
    return 2;
  }
  const Job job = ReadJob(dir);
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    Reply(std::string("no_device ") + (err != cudaSuccess ? cudaGetErrorName(err) : "no CUDA device"));
    return 5;
  }
  Harness harness(job, dir, entry);
  harness.Setup();
  std::string command;
  while (std::cin >> command) {
    if (command == "quit") break;
    if (command == "check") {
      harness.RunCheck();
    } else if (command == "time") {
      int n = 0, warmup = -1, rounds = 0;
      std::cin >> n >> warmup >> rounds;
      if (n < 1 || warmup < 0 || rounds < 1) {
        Reply("harness_error time needs N >= 1, W >= 0, R >= 1");
      } else {
        harness.RunTime(n, warmup, rounds);
      }
    } else {
      Reply("harness_error unknown command " + command);
    }
  }
  return 0;
}
