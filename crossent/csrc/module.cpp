// The host module: the launch and the driver's figures, and in the options build the training node.
#include <pybind11/pybind11.h>
#include <string>

#include "params.h"

void launch_cross_entropy(const std::string& block);
std::string device_attributes(int device);
void define_training(pybind11::module_& m);  // the options build's: training_node.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("launch", &launch_cross_entropy, "Launch a cross-entropy kernel from its packed parameter block.");
  m.def("device_attributes", [](int device) { return pybind11::bytes(device_attributes(device)); },
        "The driver's figures for the launch policy, packed.");
  if constexpr (kOptions) define_training(m);
}
