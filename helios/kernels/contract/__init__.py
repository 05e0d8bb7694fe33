"""The op contracts every kernel family declares into: op specs (spec), tolerances in roundings (tolerance), variant
selection (selection), the float dtype axis (dtypes), the op-function registry (op_functions), and which paths a
device opens (device_paths). Nothing here builds SPIR-V."""
