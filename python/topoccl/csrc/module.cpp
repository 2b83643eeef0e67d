// The Python module topoccl._C: makes the backend for torch's creator function.
#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include "backend.h"

namespace py = pybind11;

namespace topoccl {

// A process group that names its backend. torch names the group of every plugin backend
// "custom" (ProcessGroup::getBackendName, which DDP logs); a group of topoccl alone is made as
// this, so that it says "topoccl" as Gloo's says "gloo".
class NamedProcessGroup : public c10d::ProcessGroup {
 public:
  NamedProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::string name)
      : c10d::ProcessGroup(store, rank, size), name_(std::move(name)) {}

  const std::string getBackendName() const override {
    return name_;
  }

 private:
  std::string name_;
};

} // namespace topoccl

PYBIND11_MODULE(_C, m) {
  m.doc() = "topoccl's torch.distributed backend (C++): see topoccl/__init__.py";
  // ProcessGroup's Python type, the base of NamedProcessGroup's.
  py::module_::import("torch.distributed");
  py::class_<topoccl::NamedProcessGroup, c10d::ProcessGroup, c10::intrusive_ptr<topoccl::NamedProcessGroup>>(
      m, "NamedProcessGroup")
      .def(
          py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const std::string& name) {
            return c10::make_intrusive<topoccl::NamedProcessGroup>(store, rank, size, name);
          }),
          py::arg("store"),
          py::arg("rank"),
          py::arg("size"),
          py::arg("name"));
  py::class_<topoccl::ProcessGroupTopoccl, c10d::Backend, c10::intrusive_ptr<topoccl::ProcessGroupTopoccl>>(
      m, "ProcessGroupTopoccl")
      .def(
          py::init([](const c10::intrusive_ptr<c10d::Store>& store,
                      int rank,
                      int size,
                      std::chrono::milliseconds timeout,
                      const std::string& groupName,
                      const std::string& libraryPath) {
            return c10::make_intrusive<topoccl::ProcessGroupTopoccl>(store, rank, size, timeout, groupName, libraryPath);
          }),
          py::arg("store"),
          py::arg("rank"),
          py::arg("size"),
          py::arg("timeout"),
          py::arg("group_name"),
          py::arg("library_path"),
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly(
          "comm",
          [](const topoccl::ProcessGroupTopoccl& pg) -> std::optional<uintptr_t> {
            ncclComm_t c = pg.comm();
            if (c == nullptr) {
              return std::nullopt;
            }
            return reinterpret_cast<uintptr_t>(c);
          },
          "The ncclComm_t (an address), None once shut down or aborted.")
      .def_property_readonly(
          "library_path", [](const topoccl::ProcessGroupTopoccl& pg) { return pg.library().path; });
}
