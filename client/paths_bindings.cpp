// kiln._C.default_paths: kilnd's rule for the cache directory, socket, MAC key and log file
// (daemon/paths.h), for the Python client, so that it finds the daemon where kilnd puts it.
#include <pybind11/pybind11.h>

#include <string>

#include "daemon/paths.h"
#include "python_status.h"

namespace py = pybind11;

namespace kiln::paths {

void RegisterPython(py::module_& m) {
  m.def(
      "default_paths",
      [](py::object environ) {
        Environment env = ProcessEnvironment();
        if (!environ.is_none()) {
          env = [&environ](const std::string& name) {
            py::object value = environ.attr("get")(name);
            if (value.is_none()) return std::string();
            if (!PyUnicode_Check(value.ptr())) {
              ThrowPython(Status::WrongType("default_paths: " + name + " is not a str"));
            }
            return value.cast<std::string>();
          };
        }
        KilnPaths p = ResolvePaths({}, env);
        py::dict result;
        result["cache_dir"] = p.cache_dir;
        result["socket"] = p.socket;
        result["mac_key_file"] = p.mac_key_file;
        result["log_file"] = p.log_file;
        return result;
      },
      py::arg("environ") = py::none(),
      "default_paths(environ=None) -> {'cache_dir', 'socket', 'mac_key_file', 'log_file'}: "
      "kiln's default paths (absolute) under `environ` (a mapping such as os.environ; None: the "
      "process's), by the rule kilnd's defaults and `kilnd --print-paths` follow");
}

}  // namespace kiln::paths
