// Harness host program (host C++, built with `nvcc -x c++`): loads one candidate library and runs it under the harness's control.
//
//   runner <candidate.so> <job_dir> <reply_fd>
//
// job_dir/job.txt (written by the parent):
//   inputs K
//   bytes b_0 ... b_{K-1} b_out
//   dims D d_0 ... d_{D-1}
//   trials T
// with input files job_dir/in_<t>_<k>.bin (trial t, input k). The harness owns every allocation,
// the one (blocking) stream, synchronisation and timing; the candidate only sees
//   kernels_eval_call(void* const* buffers, const int* dims, cudaStream_t stream).
//
// Commands on stdin, one reply line each on <reply_fd> (never stdout, which the candidate shares):
//   check      T trials: poison the output (0xFF bytes = NaN), call, sync, write out_<t>.bin, compare
//              inputs against their pristine copies; then call trial 0 again into det.bin.
//              -> "ok check launches=<n> foreign_streams=<n> mutated=<t:k,...|->"
//   time R W   W warm-up calls, then R timed calls rotating over the trial inputs; before each: poison
//              the output, flush L2 (memset of 2x the L2 size), device-wide sync. CUDA events on the
//              harness stream bracket the call. The last timed output is written to timed.bin.
//              -> "ok time set=<t> ms=<r_0>,...,<r_{R-1}>"
//   quit
// A CUDA error replies "cuda_error <phase> <trial> <name>: <message> | last launch grid=(..) block=(..)
// smem=<bytes>" and exits with status 3: the process is not reused after an error.
//
// Kernel launches are observed by interposing __cudaLaunchKernel/cudaLaunchKernel (exported from this
// executable, so the candidate's imports bind here first) and forwarding to the CUDA runtime.
#include <cuda_runtime.h>
#include <dlfcn.h>
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

}  // namespace

extern "C" {
typedef cudaError_t (*InternalLaunchFn)(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t);
typedef cudaError_t (*PublicLaunchFn)(const void*, dim3, dim3, void**, size_t, cudaStream_t);

__attribute__((visibility("default"))) cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block,
                                                                      void** args, size_t smem,
                                                                      cudaStream_t stream) {
  static InternalLaunchFn next = (InternalLaunchFn)dlsym(RTLD_NEXT, "__cudaLaunchKernel");
  Record(grid, block, smem, stream);
  return next(kernel, grid, block, args, smem, stream);
}

__attribute__((visibility("default"))) cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block,
                                                                    void** args, size_t smem,
                                                                    cudaStream_t stream) {
  static PublicLaunchFn next = (PublicLaunchFn)dlsym(RTLD_NEXT, "cudaLaunchKernel");
  Record(grid, block, smem, stream);
  return next(func, grid, block, args, smem, stream);
}
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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <candidate.so> <job_dir> <reply_fd>\n", argv[0]);
    return 2;
  }
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
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "setup", -1);
  g_log.expected = stream;
  int l2_bytes = 0;
  Check(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0), "setup", -1);
  const size_t flush_bytes = 2 * static_cast<size_t>(l2_bytes > 0 ? l2_bytes : (64 << 20));
  void* flush = nullptr;
  Check(cudaMalloc(&flush, flush_bytes), "setup", -1);

  // Per trial: device inputs and their pristine host copies; one output buffer shared by all calls.
  std::vector<std::vector<std::vector<char>>> host(job.n_trials);
  std::vector<std::vector<void*>> dev(job.n_trials, std::vector<void*>(job.n_inputs + 1, nullptr));
  void* out = nullptr;
  Check(cudaMalloc(&out, job.out_bytes), "setup", -1);
  for (int t = 0; t < job.n_trials; ++t) {
    for (int k = 0; k < job.n_inputs; ++k) {
      host[t].push_back(ReadFile(dir + "/in_" + std::to_string(t) + "_" + std::to_string(k) + ".bin",
                                 job.in_bytes[k]));
      Check(cudaMalloc(&dev[t][k], job.in_bytes[k]), "setup", t);
      Check(cudaMemcpy(dev[t][k], host[t][k].data(), job.in_bytes[k], cudaMemcpyHostToDevice), "setup", t);
    }
    dev[t][job.n_inputs] = out;
  }
  Check(cudaDeviceSynchronize(), "setup", -1);

  auto call = [&](int t, const char* phase) {
    Check(cudaMemsetAsync(out, 0xFF, job.out_bytes, stream), phase, t);
    entry(dev[t].data(), job.dims.data(), stream);
    Check(cudaGetLastError(), phase, t);
  };
  auto download = [&](int t, const char* phase) {
    std::vector<char> data(job.out_bytes);
    Check(cudaMemcpy(data.data(), out, job.out_bytes, cudaMemcpyDeviceToHost), phase, t);
    return data;
  };

  std::string command;
  while (std::cin >> command) {
    if (command == "quit") break;
    if (command == "check") {
      std::string mutated;
      for (int t = 0; t < job.n_trials; ++t) {
        call(t, "check");
        Check(cudaDeviceSynchronize(), "check", t);
        WriteFile(dir + "/out_" + std::to_string(t) + ".bin", download(t, "check"));
        for (int k = 0; k < job.n_inputs; ++k) {
          std::vector<char> now(job.in_bytes[k]);
          Check(cudaMemcpy(now.data(), dev[t][k], job.in_bytes[k], cudaMemcpyDeviceToHost), "check", t);
          if (now != host[t][k]) {
            mutated += (mutated.empty() ? "" : ",") + std::to_string(t) + ":" + std::to_string(k);
            Check(cudaMemcpy(dev[t][k], host[t][k].data(), job.in_bytes[k], cudaMemcpyHostToDevice), "check", t);
          }
        }
      }
      call(0, "determinism");
      Check(cudaDeviceSynchronize(), "determinism", 0);
      WriteFile(dir + "/det.bin", download(0, "determinism"));
      Reply("ok check launches=" + std::to_string(g_log.launches) + " foreign_streams=" +
            std::to_string(g_log.foreign_streams) + " mutated=" + (mutated.empty() ? "-" : mutated));
    } else if (command == "time") {
      int reps = 0, warmup = 0;
      std::cin >> reps >> warmup;
      cudaEvent_t start, stop;
      Check(cudaEventCreate(&start), "time", -1);
      Check(cudaEventCreate(&stop), "time", -1);
      for (int i = 0; i < warmup; ++i) call(i % job.n_trials, "warmup");
      Check(cudaDeviceSynchronize(), "warmup", -1);
      std::ostringstream ms;
      int last = 0;
      for (int i = 0; i < reps; ++i) {
        last = i % job.n_trials;
        Check(cudaMemsetAsync(out, 0xFF, job.out_bytes, stream), "time", last);
        Check(cudaMemsetAsync(flush, i & 0xFF, flush_bytes, stream), "time", last);
        Check(cudaDeviceSynchronize(), "time", last);
        Check(cudaEventRecord(start, stream), "time", last);
        entry(dev[last].data(), job.dims.data(), stream);
        Check(cudaEventRecord(stop, stream), "time", last);
        Check(cudaEventSynchronize(stop), "time", last);
        Check(cudaDeviceSynchronize(), "time", last);
        Check(cudaGetLastError(), "time", last);
        float elapsed = 0.f;
        Check(cudaEventElapsedTime(&elapsed, start, stop), "time", last);
        ms << (i ? "," : "") << elapsed;
      }
      WriteFile(dir + "/timed.bin", download(last, "time"));
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      Reply("ok time set=" + std::to_string(last) + " ms=" + ms.str());
    } else {
      Reply("harness_error unknown command " + command);
    }
  }
  return 0;
}
