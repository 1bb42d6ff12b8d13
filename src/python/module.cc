// The `atoll._core` extension: the island around a user's parameters (src/python/tensor_island.h),
// the embedded coordinator (src/python/embedded_coordinator.h) and the codecs, for the Python
// package `atoll` (src/python/atoll/__init__.py wraps them for users). It links no libtorch, so
// one build serves every torch release: tensors cross as host memory (address, dtype, shape) that
// the Python side keeps alive and checks (contiguous, on the CPU or mirrored there), and flat fp32
// results cross as bytes. Errors cross as atoll.Error subclasses carrying atoll's message and
// canonical status code; calls that wait on the network release the GIL.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/checksum.h"
#include "inner/model_config.h"
#include "inner/train_config.h"
#include "outer/base/outer_config.h"
#include "src/config/config.h"
#include "src/python/embedded_coordinator.h"
#include "src/python/host_params.h"
#include "src/python/tensor_island.h"

namespace py = pybind11;

namespace atl::python {
namespace {

// ---- errors

struct StatusError {
  absl::Status status;
};

// atoll.Error, and a subclass per canonical code that Python users catch by kind (also a
// ValueError, LookupError, PermissionError, ConnectionError or TimeoutError where the code
// is one).
std::map<absl::StatusCode, py::object>& ErrorClasses() {
  static auto* classes = new std::map<absl::StatusCode, py::object>();
  return *classes;
}

void RegisterErrors(py::module_& m) {
  py::object base = py::reinterpret_steal<py::object>(
      PyErr_NewExceptionWithDoc("atoll.Error",
                                "An atoll call failed: str() is atoll's message, .code its "
                                "canonical status (e.g. 'INVALID_ARGUMENT').",
                                PyExc_RuntimeError, nullptr));
  m.attr("Error") = base;
  struct Kind {
    absl::StatusCode code;
    const char* name;
    PyObject* also;
  };
  const Kind kinds[] = {
      {absl::StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {absl::StatusCode::kFailedPrecondition, "FailedPreconditionError", nullptr},
      {absl::StatusCode::kNotFound, "NotFoundError", PyExc_LookupError},
      {absl::StatusCode::kAlreadyExists, "AlreadyExistsError", nullptr},
      {absl::StatusCode::kPermissionDenied, "PermissionDeniedError", PyExc_PermissionError},
      {absl::StatusCode::kUnauthenticated, "UnauthenticatedError", PyExc_PermissionError},
      {absl::StatusCode::kUnavailable, "UnavailableError", PyExc_ConnectionError},
      {absl::StatusCode::kDeadlineExceeded, "DeadlineExceededError", PyExc_TimeoutError},
      {absl::StatusCode::kResourceExhausted, "ResourceExhaustedError", nullptr},
      {absl::StatusCode::kDataLoss, "DataLossError", nullptr},
      {absl::StatusCode::kAborted, "AbortedError", nullptr},
  };
  for (const Kind& k : kinds) {
    py::tuple bases = k.also != nullptr ? py::tuple(py::make_tuple(base, py::handle(k.also)))
                                        : py::tuple(py::make_tuple(base));
    py::object cls = py::reinterpret_steal<py::object>(PyErr_NewException(
        absl::StrCat("atoll.", k.name).c_str(), bases.ptr(), nullptr));
    m.attr(k.name) = cls;
    ErrorClasses()[k.code] = cls;
  }
  ErrorClasses()[absl::StatusCode::kUnknown] = base;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      auto& classes = ErrorClasses();
      auto it = classes.find(e.status.code());
      const py::object& cls = it != classes.end() ? it->second : classes[absl::StatusCode::kUnknown];
      py::object error = cls(std::string(e.status.message()));
      error.attr("code") = absl::StatusCodeToString(e.status.code());
      PyErr_SetObject(cls.ptr(), error.ptr());
    }
  });
}

// A wait the interpreter interrupted (a signal handler raised: Ctrl-C's KeyboardInterrupt).
constexpr char kInterrupted[] = "interrupted by a Python signal handler";

// Python's signal handlers, run from a wait of the core (on the waiting thread: the main thread
// runs them); the exception one raised stays pending on that thread for Check to raise.
absl::Status PythonSignals() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) return absl::CancelledError(kInterrupted);
  return absl::OkStatus();
}

void Check(const absl::Status& s) {
  if (s.ok()) return;
  if (absl::IsCancelled(s)) {  // kInterrupted, perhaps within a longer message
    py::gil_scoped_acquire gil;
    if (PyErr_Occurred() != nullptr) throw py::error_already_set();
  }
  throw StatusError{s};
}
template <typename T>
T Check(absl::StatusOr<T> s) {
  Check(s.status());
  return *std::move(s);
}

// ---- values across

using Overrides = std::vector<std::pair<std::string, std::string>>;

// The defaults, then the TOML file (when given), then the overrides ("outer.codec", "fp4_e2m1"),
// every key checked as `atoll` checks its flags, and the sections a Python island or coordinator
// uses checked whole: [outer] and [train] (the user's loop has its own data and optimizer), and
// [model] where it is atoll's model.
Config ConfigOf(const std::string& path, const Overrides& overrides, bool atoll_model) {
  Config c = Check(LoadConfig(path, overrides, ConfigChecks::kKeys));
  if (atoll_model) Check(inner::Validate(c.model));
  Check(inner::Validate(c.train));
  Check(outer::Validate(c.outer));
  return c;
}

// Flat fp32 values as bytes (the Python side makes them a tensor).
py::bytes FloatBytes(const std::vector<float>& values) {
  return py::bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// fp32 host memory the Python side holds: (address, elements).
using FloatBuffer = std::pair<uintptr_t, uint64_t>;
const float* FloatsAt(const FloatBuffer& b) {
  if (b.first == 0 && b.second > 0) {
    throw StatusError{absl::InvalidArgumentError("a tensor's memory address is null")};
  }
  return reinterpret_cast<const float*>(b.first);
}

// The island's state: residual values as bytes of fp32.
py::dict StateDict(const IslandState& s) {
  py::list residuals;
  for (const auto& r : s.residuals) {
    py::dict d;
    d["fragment"] = r.fragment;
    d["elements"] = r.fragment_elements;
    d["ranges"] = r.ranges;
    d["values"] = FloatBytes(r.values);
    residuals.append(d);
  }
  py::dict d;
  d["format"] = 1;
  d["step"] = s.step;
  d["tokens"] = s.tokens;
  d["rounds"] = s.rounds;
  d["global_hashes"] = s.global_hashes;
  d["residuals"] = residuals;
  return d;
}

// What a state must hold to be resumed from: every field of StateDict, of its type, and residual
// ranges inside their fragment that the values fill.
IslandState StateOf(const py::dict& d) {
  const auto malformed = [](const std::string& why) {
    return StatusError{absl::InvalidArgumentError(absl::StrCat("the island state is malformed: ", why))};
  };
  IslandState s;
  try {
    if (!d.contains("format") || d["format"].cast<int>() != 1) {
      throw StatusError{absl::InvalidArgumentError(
          "the island state is not one atoll.Island.state_dict() wrote (format 1)")};
    }
    for (const char* key : {"step", "tokens", "rounds", "global_hashes", "residuals"}) {
      if (!d.contains(key)) throw malformed(absl::StrCat("no '", key, "'"));
    }
    s.step = d["step"].cast<int64_t>();
    s.tokens = d["tokens"].cast<uint64_t>();
    s.rounds = d["rounds"].cast<std::vector<uint64_t>>();
    s.global_hashes = d["global_hashes"].cast<std::vector<uint64_t>>();
    for (const auto& item : d["residuals"].cast<py::list>()) {
      const auto r = item.cast<py::dict>();
      outer::OuterStepHook::Residual residual;
      residual.fragment = r["fragment"].cast<uint32_t>();
      residual.fragment_elements = r["elements"].cast<uint64_t>();
      residual.ranges = r["ranges"].cast<std::vector<std::pair<uint64_t, uint64_t>>>();
      // The Python side hands the values over as fp32 host memory.
      const auto values = r["values"].cast<FloatBuffer>();
      const float* v = FloatsAt(values);
      residual.values.assign(v, v + values.second);
      uint64_t held = 0;
      for (const auto& [begin, end] : residual.ranges) {
        if (begin > end || end > residual.fragment_elements) {
          throw malformed(absl::StrCat("a residual range [", begin, ", ", end,
                                       ") of fragment ", residual.fragment, " (",
                                       residual.fragment_elements, " elements)"));
        }
        held += end - begin;
      }
      if (held != residual.values.size()) {
        throw malformed(absl::StrCat("fragment ", residual.fragment, "'s residual ranges hold ",
                                     held, " elements, its values ", residual.values.size()));
      }
      s.residuals.push_back(std::move(residual));
    }
  } catch (const py::cast_error& e) {
    throw malformed(e.what());
  } catch (const py::error_already_set& e) {
    throw malformed(e.what());
  }
  if (s.step < 0) throw malformed("its step is negative");
  return s;
}

// ---- codecs

compression::CodecSpec SpecOf(const std::string& codec, double topk_density, int topk_chunk) {
  // As the config keys say them (and checked as they are); error feedback is the caller's own
  // affair here, not the run rule that sparse pushes need it.
  Overrides o = {{"outer.codec", codec},
                 {"outer.topk_density", absl::StrCat(topk_density)},
                 {"outer.topk_chunk", absl::StrCat(topk_chunk)},
                 {"outer.error_feedback", "true"}};
  return ConfigOf("", o, /*atoll_model=*/false).outer.wire_codec();
}

py::bytes Encode(const FloatBuffer& flat, const std::string& codec, double topk_density,
                 int topk_chunk, bool stochastic, uint64_t seed) {
  const compression::CodecSpec spec = SpecOf(codec, topk_density, topk_chunk);
  const float* values = FloatsAt(flat);
  const size_t n = size_t(flat.second);
  std::string out(compression::EncodedBytes(spec, n), '\0');
  {
    py::gil_scoped_release release;
    Check(compression::Encode(spec, values, n, reinterpret_cast<uint8_t*>(out.data()),
                              {stochastic, seed, 0}));
  }
  return py::bytes(out);
}

py::bytes Decode(const py::bytes& payload, const std::string& codec, int64_t n,
                 double topk_density, int topk_chunk) {
  const compression::CodecSpec spec = SpecOf(codec, topk_density, topk_chunk);
  if (n < 0) throw StatusError{absl::InvalidArgumentError("the element count is negative")};
  const std::string bytes = payload;
  const size_t expected = compression::EncodedBytes(spec, size_t(n));
  if (bytes.size() != expected) {
    throw StatusError{absl::InvalidArgumentError(absl::StrCat(
        "a ", compression::SpecText(spec), " payload of ", n, " elements is ", expected,
        " bytes, got ", bytes.size()))};
  }
  std::vector<float> out(static_cast<size_t>(n));
  {
    py::gil_scoped_release release;
    Check(compression::Decode(spec, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                              size_t(n), out.data()));
  }
  return FloatBytes(out);
}

// ---- the island and the coordinator

// A parameter as the Python side describes it: name, host address, dtype name, shape.
using ParamSpec = std::tuple<std::string, uintptr_t, std::string, std::vector<int64_t>>;

std::vector<HostParam> HostParamsOf(const std::vector<ParamSpec>& specs) {
  std::vector<HostParam> params;
  for (const auto& [name, address, dtype, shape] : specs) {
    HostParam p;
    p.name = name;
    p.data = reinterpret_cast<void*>(address);
    auto kind = DTypeNamed(dtype);
    if (!kind.ok()) {
      throw StatusError{absl::InvalidArgumentError(
          absl::StrCat("parameter '", name, "': ", kind.status().message()))};
    }
    p.dtype = *kind;
    p.shape = shape;
    params.push_back(std::move(p));
  }
  return params;
}

// A Python callable that atoll's threads call with the GIL taken, and let go of under it.
std::function<absl::Status(const std::vector<size_t>&)> Callable(py::function f) {
  auto held = std::shared_ptr<py::function>(new py::function(std::move(f)), [](py::function* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
  return [held](const std::vector<size_t>& indices) {
    py::gil_scoped_acquire gil;
    try {
      (*held)(indices);
      return absl::OkStatus();
    } catch (const py::error_already_set& e) {
      return absl::InternalError(absl::StrCat("copying parameters to or from their host mirrors: ",
                                              e.what()));
    }
  };
}

std::unique_ptr<TensorIsland> JoinIsland(
    const std::vector<ParamSpec>& params, std::optional<std::pair<py::function, py::function>> mirrors,
    const std::string& coordinator,
    const std::string& name, const std::string& token, const std::string& config_path,
    const Overrides& overrides, bool atoll_model, const std::string& credential_file,
    const std::optional<py::dict>& state, const std::vector<std::string>& tls, bool quiet) {
  TensorIslandOptions o;
  o.config = ConfigOf(config_path, overrides, atoll_model);
  o.atoll_model = atoll_model;
  o.coordinator = coordinator;
  o.token = token;
  o.name = name;
  o.credential_file = credential_file;
  if (tls.size() == 3) {  // ca, cert, key
    o.tls.ca = tls[0];
    o.tls.cert = tls[1];
    o.tls.key = tls[2];
  }
  if (state) o.resume = StateOf(*state);
  o.out = quiet ? nullptr : stderr;
  o.interrupted = PythonSignals;
  std::vector<HostParam> host = HostParamsOf(params);  // the Python side keeps the memory alive
  MirrorCopies copies;
  if (mirrors) {
    copies.to_host = Callable(std::move(mirrors->first));
    copies.from_host = Callable(std::move(mirrors->second));
  }
  py::gil_scoped_release release;
  return Check(TensorIsland::Join(std::move(o), std::move(host), std::move(copies)));
}

std::unique_ptr<EmbeddedCoordinator> StartCoordinator(
    const std::string& config_path, const Overrides& overrides, const std::string& listen,
    const std::string& token, const std::string& run_dir, bool resume,
    const std::string& http_listen,
    const std::vector<std::tuple<std::string, std::vector<int64_t>, FloatBuffer>>& module,
    uint64_t tokens_per_step, bool quiet) {
  EmbeddedCoordinatorOptions o;
  o.config = ConfigOf(config_path, overrides, /*atoll_model=*/false);
  o.listen = listen;
  o.token = token;
  o.run_dir = run_dir;
  o.resume = resume;
  o.http_listen = http_listen;
  o.out = quiet ? nullptr : stderr;
  // Each parameter's fp32 values, flat row-major, as the Python side made them.
  ModuleParams m;
  for (const auto& [name, shape, values] : module) {
    const float* v = FloatsAt(values);
    m.layout.names.push_back(name);
    m.layout.numels.push_back(values.second);
    m.shapes.push_back(shape);
    m.values.insert(m.values.end(), v, v + values.second);
  }
  if (m.layout.names.empty()) {
    throw StatusError{absl::InvalidArgumentError("the module has no parameters to serve")};
  }
  m.tokens_per_step = tokens_per_step;
  o.module = std::move(m);
  py::gil_scoped_release release;
  return Check(EmbeddedCoordinator::Start(std::move(o)));
}

// A const accessor called without the GIL (its result is a plain C++ value, cast after): the
// island's turn may wait for a step.
template <typename R>
auto Unlocked(R (TensorIsland::*f)() const) {
  return [f](const TensorIsland& island) {
    py::gil_scoped_release release;
    return (island.*f)();
  };
}

py::list LandedRounds(const TensorIsland& island) {
  py::list out;
  for (const auto& r : Unlocked(&TensorIsland::landed)(island)) {
    py::dict d;
    d["fragment"] = r.fragment;
    d["round"] = r.round;
    d["version"] = r.version;
    d["pushed_at"] = r.pushed_at;
    d["step"] = r.step;
    d["global_hash"] = r.global_hash;
    d["contributors"] = r.contributors;
    d["resynced"] = r.resynced;
    out.append(d);
  }
  return out;
}

py::dict Stats(const TensorIsland& island) {
  const outer::OuterStepStats s = Unlocked(&TensorIsland::stats)(island);
  py::dict d;
  d["rounds"] = s.rounds;
  d["resyncs"] = s.resyncs;
  d["rejoins"] = s.rejoins;
  d["late_pushes"] = s.late_pushes;
  d["idle_s"] = s.idle_s;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["elements_synced"] = s.elements_synced;
  d["seeded_fragments"] = s.seeded_fragments;
  d["tau"] = s.tau;
  return d;
}

}  // namespace
}  // namespace atl::python

namespace atl::python {
namespace {

void BindCodecs(py::module_& m) {
  m.def("encode", &Encode, py::arg("flat"), py::arg("codec"), py::arg("topk_density") = 1.0,
        py::arg("topk_chunk") = 4096, py::arg("stochastic") = false, py::arg("seed") = 0);
  m.def("decode", &Decode, py::arg("payload"), py::arg("codec"), py::arg("numel"),
        py::arg("topk_density") = 1.0, py::arg("topk_chunk") = 4096);
  m.def("encoded_bytes", [](const std::string& codec, int64_t n, double density, int chunk) {
    return atl::compression::EncodedBytes(SpecOf(codec, density, chunk), size_t(std::max<int64_t>(0, n)));
  }, py::arg("codec"), py::arg("numel"), py::arg("topk_density") = 1.0, py::arg("topk_chunk") = 4096);
  m.def("params_hash", [](const FloatBuffer& flat) {
    return atl::compression::ParamsHash(FloatsAt(flat), 0, size_t(flat.second));
  }, py::arg("flat"), "atoll's hash of fp32 parameters (a fragment's, flat), as islands and the "
     "service print it");
  m.def("resolved_config", [](const std::string& path, const Overrides& overrides) {
    return atl::ToToml(ConfigOf(path, overrides, false));
  }, py::arg("path"), py::arg("overrides"));
}

void BindIsland(py::module_& m) {
  py::class_<atl::python::TensorIsland>(m, "_Island")
      .def(py::init(&JoinIsland), py::arg("params"), py::arg("mirrors"), py::arg("coordinator"),
           py::arg("name"),
           py::arg("token"), py::arg("config_path"), py::arg("overrides"), py::arg("atoll_model"),
           py::arg("credential_file"), py::arg("state"), py::arg("tls"), py::arg("quiet"))
      .def("step", [](TensorIsland& i, uint64_t tokens, std::optional<double> loss, bool stop) {
        py::gil_scoped_release release;
        return Check(i.Step(tokens, loss, stop));
      }, py::arg("tokens"), py::arg("loss"), py::arg("stop"))
      .def("request_stop", &TensorIsland::RequestStop)  // never waits: a signal handler's call
      .def("close", [](TensorIsland& i) {
        py::gil_scoped_release release;
        Check(i.Close());
      })
      .def("state",
           [](const TensorIsland& i) { return StateDict(Unlocked(&TensorIsland::State)(i)); })
      // Each call waits for the island's turn (a step may be waiting for a round) without the GIL.
      .def_property_readonly("step_count", Unlocked(&TensorIsland::step))
      .def_property_readonly("tokens", Unlocked(&TensorIsland::tokens))
      .def_property_readonly("done", Unlocked(&TensorIsland::done))
      .def_property_readonly("is_async", &TensorIsland::async)
      .def_property_readonly("max_steps", Unlocked(&TensorIsland::max_steps))
      .def_property_readonly("run_progress", Unlocked(&TensorIsland::run_progress))
      .def_property_readonly("num_fragments", &TensorIsland::num_fragments)
      .def_property_readonly("fragment_parameters", &TensorIsland::fragment_parameters)
      .def_property_readonly("fragment_hashes", Unlocked(&TensorIsland::fragment_hashes))
      .def_property_readonly("rounds", Unlocked(&TensorIsland::rounds))
      .def_property_readonly("island_id", &TensorIsland::island_id)
      .def_property_readonly("landed", &LandedRounds)
      .def_property_readonly("stats", &Stats)
      .def("describe", Unlocked(&TensorIsland::Describe));
}

void BindCoordinator(py::module_& m) {
  py::class_<EmbeddedCoordinator>(m, "_Coordinator")
      .def(py::init(&StartCoordinator), py::arg("config_path"), py::arg("overrides"),
           py::arg("listen"), py::arg("token"), py::arg("run_dir"), py::arg("resume"),
           py::arg("http_listen"), py::arg("module"), py::arg("tokens_per_step"), py::arg("quiet"))
      .def_property_readonly("address", &EmbeddedCoordinator::address)
      .def("wait", [](EmbeddedCoordinator& c, double timeout_s) {
        py::gil_scoped_release release;
        return Check(c.Wait(timeout_s));
      }, py::arg("timeout_s"))
      .def("stop", [](EmbeddedCoordinator& c) {
        py::gil_scoped_release release;
        Check(c.Stop());
      })
      .def_property_readonly("rounds", &EmbeddedCoordinator::rounds)
      .def_property_readonly("committed_rounds", &EmbeddedCoordinator::committed_rounds)
      .def_property_readonly("params_hashes", [](const EmbeddedCoordinator& c) {
        py::gil_scoped_release release;  // a commit may hold the service's lock
        return c.params_hashes();
      })
      .def_property_readonly("fragment_parameters", &EmbeddedCoordinator::fragment_parameters)
      .def("params", [](const EmbeddedCoordinator& c) {
        std::vector<std::vector<float>> params;
        {
          py::gil_scoped_release release;  // a commit may hold the fragment's data
          params = c.params();
        }
        std::vector<py::bytes> out;
        for (const auto& flat : params) out.push_back(FloatBytes(flat));
        return out;
      });
}

}  // namespace
}  // namespace atl::python

PYBIND11_MODULE(_core, m) {
  m.doc() = "atoll's C++ core for the `atoll` Python package (use `import atoll`).";
  m.attr("__version__") = ATOLL_VERSION;
  atl::python::RegisterErrors(m);
  atl::python::BindCodecs(m);
  atl::python::BindIsland(m);
  atl::python::BindCoordinator(m);
}
