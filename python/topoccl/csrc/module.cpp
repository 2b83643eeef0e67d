// The Python module topoccl._C: makes the backend for torch's creator function.
#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include "backend.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "topoccl's torch.distributed backend (C++): see topoccl/__init__.py";
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
