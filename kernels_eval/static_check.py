"""Static checks on untrusted Python: Pallas candidates and generated tasks' `reference` functions.

The source is parsed with `ast`, never executed, and held to allow-lists: whatever is not named here
is refused. A finding is a `Rejection(reason, message, line)`; `reason` is a short snake_case code that
becomes `EvalResult.rejected_reason`. The checks fail closed: `check_python`, `check_pallas_candidate`
and `check_reference` never raise; an exception while parsing or checking (RecursionError,
MemoryError, a bug here) is a Rejection (`too_deeply_nested`, `static_check_failed`).

Limits, before any recursive pass: the source's size (`source_too_large`); a linear scan of its tokens
bounds bracket depth, indentation, `elif` chains and the operators of one statement, and so the depth
of the tree `ast.parse` would build (`too_deeply_nested`); then the tree's depth, measured iteratively.
Text `ast.parse` refuses, null bytes and lone surrogates are `syntax_error`.

Allow-lists:
  statements   `ALLOWED_STATEMENTS`, imports at module level only. Refused by name
               (`forbidden_construct`): `match` (class patterns look attributes up by name), `try`,
               `with`, `class`, `async`, `del`, walrus, `yield`, `await`; `global`/`nonlocal` are
               `mutable_global_state`. f-strings are allowed: their embedded expressions are checked
               like any other, and a format spec only formats a value, it cannot reach attributes.
  names        a name is one the source defines (function, parameter, local, comprehension variable,
               module constant), an import alias, or in `ALLOWED_BUILTINS` (`forbidden_builtin` for
               other builtins, `undefined_name` for the rest); scopes are resolved as Python does
               (a comprehension's first iterable, defaults and decorators belong to the enclosing
               scope; module level sees only what earlier statements bound). No dunder names.
  attributes   `module.name` must be in that module's list in `MODULE_ATTRIBUTES`; an attribute of
               any other value (array, ref, dtype, precision, local list) in `VALUE_ATTRIBUTES`;
               `ALLOWED_ATTRIBUTES` is their union. A module is only ever the base of an attribute
               (`module_as_value`) and its alias is never rebound (`shadowed_import`), so `jnp.load`
               cannot pass as `m.load` (`load` is allowed only on the Triton module, for `plt.load`).
               Refused with their own codes: `format`/`format_map` (`format_string`), names starting
               with `__` (`dunder_access`) or `_` (`private_access`), the escape hatches of
               `FORBIDDEN_ATTRS` (`forbidden_api`); any other name is `forbidden_attribute`.
  imports      modules in the allow-list given (`PALLAS_MODULES`, `REFERENCE_MODULES`), else
               `forbidden_import` (`network_access` for network modules); `from M import n` needs `n`
               in M's list.

No string ever becomes an attribute name: names are fixed in the source and checked above, and every
way to look one up from a string (`getattr`, `vars`, `globals`, `__dict__`, `str.format` and
`format_map` fields, `operator.attrgetter`, `type(...)`, `match` class patterns) is outside the
allow-lists. A dunder name built at runtime from pieces is therefore only a string; string constants
naming dunders are still refused (`dunder_access`) as a second line.

Import time and state:
  code_at_import        module level holds only imports, docstrings, `pass`, asserts, function
                        definitions and constants built from literals, earlier names, module
                        attributes, arithmetic, lambdas and the pure calls of `IMPORT_TIME_CALLS`
                        (`functools.partial(f, k=CONSTANT)`, `jnp.float32(...)`, `math.sqrt(...)`, ...).
  decorator_at_import   a module-level function may be decorated only with `jax.jit` or
                        `functools.partial(jax.jit, static_argnums=..., static_argnames=...)`; a nested
                        function's decorators run when its enclosing function runs, as any call there.
  mutable_global_state  no list, dict or set displays or comprehensions at module level; default
                        arguments without displays or calls; no attribute stores; no subscript store
                        whose base is not a variable of an enclosing function (`o_ref[...] = v` with
                        `o_ref` a parameter is fine).
  harness_option        no `interpret=`/`backend=` arguments: the harness chooses the mode.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import io
import re
import threading
import tokenize

MAX_SOURCE_BYTES = 64 << 10
MAX_AST_DEPTH = 64
MAX_BRACKET_DEPTH = 32
MAX_INDENT_DEPTH = 24
MAX_STATEMENT_OPERATORS = 400
MAX_ELIF_BRANCHES = 100
PALLAS_MODULES = frozenset({"jax", "jax.numpy", "jax.lax", "jax.experimental.pallas",
                            "jax.experimental.pallas.triton", "functools", "math"})
REFERENCE_MODULES = frozenset({"jax", "jax.numpy", "jax.lax", "math"})
_REFERENCE_ALIASES = {"jax": "jax", "jnp": "jax.numpy", "lax": "jax.lax", "math": "math"}
NETWORK_MODULES = frozenset({"socket", "ssl", "http", "urllib", "urllib3", "requests", "ftplib", "smtplib",
                             "asyncio", "select", "selectors", "xmlrpc", "socketserver", "telnetlib"})
HARNESS_KWARGS = frozenset({"interpret", "backend"})

# The complement, named for clearer reason codes and messages (`forbidden_builtin`, `forbidden_api`);
# the allow-lists below decide what passes.
FORBIDDEN_NAMES = frozenset({
    "eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr", "globals", "locals",
    "vars", "input", "breakpoint", "memoryview", "exit", "quit", "help", "dir", "__builtins__", "type", "object",
    "super", "print", "format", "classmethod", "staticmethod", "property"})
FORBIDDEN_ATTRS = frozenset({
    "config", "callback", "pure_callback", "io_callback", "debug_callback", "host_callback", "save",
    "savez", "savez_compressed", "fromfile", "tofile", "profiler", "distributed", "extend", "ffi", "dlpack",
    "from_dlpack", "clear_caches", "live_arrays", "cache", "lru_cache", "cached_property", "system",
    "popen", "environ", "modules", "interpreters", "version", "format", "format_map", "debug", "debug_print",
    "debug_check", "elementwise_inline_asm", "platform_dependent", "default_backend", "devices",
    # frames, code and tracebacks reach the harness's globals without a dunder name
    "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code", "f_back",
    "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "tb_next", "co_code", "co_consts"})

ALLOWED_BUILTINS = frozenset({
    "AssertionError", "Ellipsis", "False", "None", "NotImplementedError", "True", "ValueError", "abs", "all", "any",
    "bool", "dict", "divmod", "enumerate", "float", "int", "isinstance", "len", "list", "map", "max", "min", "pow",
    "range", "reversed", "round", "slice", "sorted", "sum", "tuple", "zip"})

# Public names of the allowed modules (jax 0.10.2), less what reaches files, the host, callbacks,
# configuration, collectives, randomness, uninitialised memory, inline assembly or other modules.
JAX_ATTRIBUTES = frozenset({
    "Array", "ShapeDtypeStruct", "experimental", "jit", "lax", "nn", "numpy", "vmap"
})
JNP_ATTRIBUTES = frozenset({
    "abs", "absolute", "acos", "acosh", "add", "all", "allclose", "amax", "amin", "angle", "any", "append",
    "apply_along_axis", "apply_over_axes", "arange", "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctan2",
    "arctanh", "argmax", "argmin", "argpartition", "argsort", "argwhere", "around", "array", "array_equal",
    "array_equiv", "array_split", "asarray", "asin", "asinh", "astype", "atan", "atan2", "atanh", "atleast_1d",
    "atleast_2d", "atleast_3d", "average", "bartlett", "bfloat16", "bincount", "bitwise_and", "bitwise_count",
    "bitwise_invert", "bitwise_left_shift", "bitwise_not", "bitwise_or", "bitwise_right_shift", "bitwise_xor",
    "blackman", "block", "bool", "bool_", "broadcast_arrays", "broadcast_shapes", "broadcast_to", "c_", "can_cast",
    "cbrt", "cdouble", "ceil", "character", "choose", "clip", "column_stack", "complex128", "complex64", "complex_",
    "complexfloating", "compress", "concat", "concatenate", "conj", "conjugate", "convolve", "copy", "copysign",
    "corrcoef", "correlate", "cos", "cosh", "count_nonzero", "cov", "cross", "csingle", "cumprod", "cumsum",
    "cumulative_prod", "cumulative_sum", "deg2rad", "degrees", "delete", "diag", "diag_indices",
    "diag_indices_from", "diagflat", "diagonal", "diff", "digitize", "divide", "divmod", "dot", "double", "dsplit",
    "dstack", "dtype", "e", "ediff1d", "einsum", "einsum_path", "empty", "empty_like", "equal", "euler_gamma",
    "exp", "exp2", "expand_dims", "expm1", "extract", "eye", "fabs", "fill_diagonal", "finfo", "flatnonzero",
    "flexible", "flip", "fliplr", "flipud", "float16", "float32", "float4_e2m1fn", "float64", "float6_e2m3fn",
    "float6_e3m2fn", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float_", "float_power", "floating", "floor",
    "floor_divide", "fmax", "fmin", "fmod", "frexp", "fromfunction", "full", "full_like", "gcd", "generic",
    "geomspace", "gradient", "greater", "greater_equal", "hamming", "hanning", "heaviside", "histogram",
    "histogram2d", "histogram_bin_edges", "histogramdd", "hsplit", "hstack", "hypot", "i0", "identity", "iinfo",
    "imag", "index_exp", "indices", "inexact", "inf", "inner", "insert", "int1", "int16", "int2", "int32", "int4",
    "int64", "int8", "int_", "integer", "interp", "intersect1d", "invert", "isclose", "iscomplex", "iscomplexobj",
    "isdtype", "isfinite", "isin", "isinf", "isnan", "isneginf", "isposinf", "isreal", "isrealobj", "isscalar",
    "issubdtype", "ix_", "kaiser", "kron", "lcm", "ldexp", "left_shift", "less", "less_equal", "lexsort", "linalg",
    "linspace", "log", "log10", "log1p", "log2", "logaddexp", "logaddexp2", "logical_and", "logical_not",
    "logical_or", "logical_xor", "logspace", "mask_indices", "matmul", "matrix_transpose", "matvec", "max",
    "maximum", "mean", "median", "meshgrid", "mgrid", "min", "minimum", "mod", "modf", "moveaxis", "multiply",
    "nan", "nan_to_num", "nanargmax", "nanargmin", "nancumprod", "nancumsum", "nanmax", "nanmean", "nanmedian",
    "nanmin", "nanpercentile", "nanprod", "nanquantile", "nanstd", "nansum", "nanvar", "ndarray", "ndim",
    "negative", "newaxis", "nextafter", "nonzero", "not_equal", "number", "ogrid", "ones", "ones_like", "outer",
    "packbits", "pad", "partition", "percentile", "permute_dims", "pi", "piecewise", "place", "poly", "polyadd",
    "polyder", "polydiv", "polyfit", "polyint", "polymul", "polysub", "polyval", "positive", "pow", "power", "prod",
    "promote_types", "ptp", "put", "put_along_axis", "quantile", "r_", "rad2deg", "radians", "ravel",
    "ravel_multi_index", "real", "reciprocal", "remainder", "repeat", "reshape", "resize", "result_type",
    "right_shift", "rint", "roll", "rollaxis", "roots", "rot90", "round", "s_", "searchsorted", "select",
    "setdiff1d", "setxor1d", "shape", "sign", "signbit", "signedinteger", "sin", "sinc", "single", "sinh", "size",
    "sort", "sort_complex", "spacing", "split", "sqrt", "square", "squeeze", "stack", "std", "subtract", "sum",
    "swapaxes", "take", "take_along_axis", "tan", "tanh", "tensordot", "tile", "trace", "transpose", "trapezoid",
    "tri", "tril", "tril_indices", "tril_indices_from", "trim_zeros", "triu", "triu_indices", "triu_indices_from",
    "true_divide", "trunc", "uint", "uint1", "uint16", "uint2", "uint32", "uint4", "uint64", "uint8", "union1d",
    "unique", "unique_all", "unique_counts", "unique_inverse", "unique_values", "unpackbits", "unravel_index",
    "unsignedinteger", "unstack", "unwrap", "vander", "var", "vdot", "vecdot", "vecmat", "vectorize", "vsplit",
    "vstack", "where", "zeros", "zeros_like"
})
JNP_LINALG_ATTRIBUTES = frozenset({
    "cholesky", "cond", "cross", "det", "diagonal", "eig", "eigh", "eigvals", "eigvalsh", "inv", "lstsq", "matmul",
    "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "multi_dot", "norm", "outer", "pinv", "qr",
    "slogdet", "solve", "svd", "svdvals", "tensordot", "tensorinv", "tensorsolve", "trace", "vecdot", "vector_norm"
})
LAX_ATTRIBUTES = frozenset({
    "AccuracyMode", "ConvDimensionNumbers", "ConvGeneralDilatedDimensionNumbers", "DotAlgorithm",
    "DotAlgorithmPreset", "DotDimensionNumbers", "FftType", "GatherDimensionNumbers", "GatherScatterMode",
    "Precision", "PrecisionLike", "RaggedDotDimensionNumbers", "RoundingMethod", "ScatterDimensionNumbers",
    "Tolerance", "abs", "acos", "acosh", "add", "approx_max_k", "approx_min_k", "argmax", "argmin", "asin", "asinh",
    "associative_scan", "atan", "atan2", "atanh", "batch_matmul", "bessel_i0e", "bessel_i1e", "betainc",
    "bitcast_convert_type", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "broadcast",
    "broadcast_in_dim", "broadcast_like", "broadcast_shapes", "broadcast_to_rank", "broadcasted_iota", "cbrt",
    "ceil", "clamp", "clz", "collapse", "complex", "concatenate", "cond", "conj", "conv", "conv_dimension_numbers",
    "conv_general_dilated", "conv_general_dilated_local", "conv_general_dilated_patches",
    "conv_general_permutations", "conv_general_shape_tuple", "conv_shape_tuple", "conv_transpose",
    "conv_transpose_shape_tuple", "conv_with_general_padding", "convert_element_type", "cos", "cosh",
    "cumlogsumexp", "cummax", "cummin", "cumprod", "cumsum", "custom_linear_solve", "custom_root", "digamma", "div",
    "dot", "dot_general", "dtype", "dynamic_index_in_dim", "dynamic_slice", "dynamic_slice_in_dim",
    "dynamic_update_index_in_dim", "dynamic_update_slice", "dynamic_update_slice_in_dim", "eq", "erf", "erf_inv",
    "erfc", "exp", "exp2", "expand_dims", "expm1", "fft", "floor", "fori_loop", "full", "full_like", "gather", "ge",
    "gt", "igamma", "igamma_grad_a", "igammac", "imag", "index_in_dim", "index_take", "integer_pow", "iota",
    "is_finite", "le", "lgamma", "log", "log1p", "logistic", "lt", "map", "max", "min", "mul", "mulhi", "ne", "neg",
    "nextafter", "optimization_barrier", "pad", "padtype_to_pads", "polygamma", "population_count", "pow",
    "ragged_dot", "ragged_dot_general", "real", "reciprocal", "reduce", "reduce_and", "reduce_max", "reduce_min",
    "reduce_or", "reduce_precision", "reduce_prod", "reduce_sum", "reduce_window", "reduce_window_shape_tuple",
    "reduce_xor", "rem", "reshape", "rev", "round", "rsqrt", "scaled_dot", "scan", "scatter", "scatter_add",
    "scatter_apply", "scatter_max", "scatter_min", "scatter_mul", "scatter_sub", "select", "select_n", "shift_left",
    "shift_right_arithmetic", "shift_right_logical", "sign", "sin", "sinh", "slice", "slice_in_dim", "sort",
    "sort_key_val", "split", "sqrt", "square", "squeeze", "stack", "stop_gradient", "sub", "switch", "tan", "tanh",
    "tile", "top_k", "transpose", "unstack", "while_loop", "zeta"
})
NN_ATTRIBUTES = frozenset({
    "celu", "dot_product_attention", "elu", "gelu", "glu", "hard_sigmoid", "hard_silu", "hard_swish", "hard_tanh",
    "identity", "leaky_relu", "log1mexp", "log_sigmoid", "log_softmax", "logmeanexp", "logsumexp", "mish",
    "one_hot", "relu", "relu6", "scaled_dot_general", "scaled_matmul", "selu", "sigmoid", "silu", "soft_sign",
    "softmax", "softplus", "sparse_plus", "sparse_sigmoid", "squareplus", "standardize", "swish", "tanh"
})
PALLAS_ATTRIBUTES = frozenset({
    "BlockSpec", "Blocked", "BoundedSlice", "Buffered", "CostEstimate", "Element", "GridSpec", "Slice", "Squeezed",
    "broadcast_to", "cdiv", "ds", "dslice", "loop", "multiple_of", "next_power_of_2", "no_block_spec",
    "num_programs", "pallas_call", "program_id", "reciprocal", "run_scoped", "squeezed", "triton", "when"
})
PALLAS_TRITON_ATTRIBUTES = frozenset({
    "CompilerParams", "approx_tanh", "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min",
    "atomic_or", "atomic_xchg", "atomic_xor", "dot", "load", "max_contiguous", "store"
})
MATH_ATTRIBUTES = frozenset({
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "comb", "copysign", "cos", "cosh",
    "degrees", "dist", "e", "erf", "erfc", "exp", "exp2", "expm1", "fabs", "factorial", "floor", "fmod", "frexp",
    "fsum", "gamma", "gcd", "hypot", "inf", "isclose", "isfinite", "isinf", "isnan", "isqrt", "lcm", "ldexp",
    "lgamma", "log", "log10", "log1p", "log2", "modf", "nan", "nextafter", "perm", "pi", "pow", "prod", "radians",
    "remainder", "sin", "sinh", "sqrt", "tan", "tanh", "tau", "trunc", "ulp"
})

JAX_EXPERIMENTAL_ATTRIBUTES = frozenset({"pallas"})
FUNCTOOLS_ATTRIBUTES = frozenset({"partial"})
# Attributes of values that are not modules: arrays and refs (methods, `.at[...]` updates), dtypes and
# their finfo/iinfo, `lax.Precision`, and the lists, tuples and dicts a function builds for itself.
VALUE_ATTRIBUTES = frozenset({
    "DEFAULT", "HIGH", "HIGHEST", "T", "add", "all", "any", "append", "argmax", "argmin", "argsort", "astype", "at",
    "bits", "clip", "conj", "conjugate", "copy", "count", "cumprod", "cumsum", "diagonal", "divide", "dot", "dtype",
    "eps", "flatten", "get", "imag", "index", "insert", "items", "itemsize", "keys", "mT", "max", "mean", "min",
    "mul", "multiply", "name", "nbytes", "ndim", "nonzero", "pop", "power", "prod", "ptp", "ravel", "real",
    "repeat", "reshape", "resolution", "round", "searchsorted", "set", "shape", "size", "smallest_normal", "sort",
    "squeeze", "std", "subtract", "sum", "swapaxes", "take", "tiny", "transpose", "values", "var"})
MODULE_ATTRIBUTES = {
    "jax": JAX_ATTRIBUTES, "jax.numpy": JNP_ATTRIBUTES, "jax.numpy.linalg": JNP_LINALG_ATTRIBUTES,
    "jax.lax": LAX_ATTRIBUTES, "jax.nn": NN_ATTRIBUTES, "jax.experimental": JAX_EXPERIMENTAL_ATTRIBUTES,
    "jax.experimental.pallas": PALLAS_ATTRIBUTES, "jax.experimental.pallas.triton": PALLAS_TRITON_ATTRIBUTES,
    "functools": FUNCTOOLS_ATTRIBUTES, "math": MATH_ATTRIBUTES}
ALLOWED_ATTRIBUTES = VALUE_ATTRIBUTES.union(*MODULE_ATTRIBUTES.values())
# Submodules reached only as attributes (`jax.nn.relu`), when their parent is importable.
ATTRIBUTE_MODULES = frozenset({"jax.nn", "jax.numpy.linalg"})
# The calls module-level constants may make (qualified names): pure, no candidate code.
IMPORT_TIME_CALLS = frozenset({
    "abs", "bool", "divmod", "float", "functools.partial", "int", "jax.experimental.pallas.cdiv",
    "jax.experimental.pallas.next_power_of_2", "jax.jit", "jax.numpy.bfloat16", "jax.numpy.dtype",
    "jax.numpy.finfo", "jax.numpy.float16", "jax.numpy.float32", "jax.numpy.iinfo", "jax.numpy.int16",
    "jax.numpy.int32", "jax.numpy.int8", "jax.numpy.uint32", "jax.numpy.uint8", "len", "math.ceil", "math.erf",
    "math.exp", "math.floor", "math.gcd", "math.isqrt", "math.lcm", "math.log", "math.log2", "math.prod",
    "math.sqrt", "max", "min", "pow", "range", "round", "tuple"})
JIT_DECORATOR_KWARGS = frozenset({"static_argnums", "static_argnames"})

ALLOWED_STATEMENTS = (ast.FunctionDef, ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.While,
                      ast.If, ast.Expr, ast.Pass, ast.Break, ast.Continue, ast.Assert, ast.Raise, ast.Import,
                      ast.ImportFrom)
ALLOWED_EXPRESSIONS = (ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Lambda, ast.IfExp, ast.Dict, ast.Set, ast.ListComp,
                       ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Compare, ast.Call, ast.FormattedValue,
                       ast.JoinedStr, ast.Constant, ast.Attribute, ast.Subscript, ast.Starred, ast.Name, ast.List,
                       ast.Tuple, ast.Slice)
_ALLOWED_PARTS = (ast.Module, ast.arguments, ast.arg, ast.keyword, ast.alias, ast.comprehension,
                  ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)
_ALLOWED_NODES = ALLOWED_STATEMENTS + ALLOWED_EXPRESSIONS + _ALLOWED_PARTS
REFUSED_CONSTRUCTS = {
    "Match": ("forbidden_construct", "`match` statements are not allowed (class patterns look attributes up by name)"),
    "Try": ("forbidden_construct", "`try` statements are not allowed"),
    "TryStar": ("forbidden_construct", "`try` statements are not allowed"),
    "With": ("forbidden_construct", "`with` statements are not allowed (context managers run code on entry and exit)"),
    "AsyncWith": ("forbidden_construct", "async code is not allowed"),
    "AsyncFor": ("forbidden_construct", "async code is not allowed"),
    "AsyncFunctionDef": ("forbidden_construct", "async functions are not allowed"),
    "Await": ("forbidden_construct", "async code is not allowed"),
    "ClassDef": ("forbidden_construct", "class definitions are not allowed in kernel code"),
    "Delete": ("forbidden_construct", "`del` is not allowed"),
    "NamedExpr": ("forbidden_construct", "assignment expressions (`:=`) are not allowed"),
    "Yield": ("forbidden_construct", "generators (`yield`) are not allowed: a suspended frame keeps state"),
    "YieldFrom": ("forbidden_construct", "generators (`yield`) are not allowed: a suspended frame keeps state"),
    "Global": ("mutable_global_state", "`global` is not allowed (no mutable module-level state)"),
    "Nonlocal": ("mutable_global_state", "`nonlocal` is not allowed (no state kept across calls)"),
}
_MUTABLE_VALUES = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp)
_IMPORT_TIME_NODES = (ast.Constant, ast.Name, ast.Attribute, ast.Tuple, ast.Starred, ast.BinOp, ast.UnaryOp,
                      ast.BoolOp, ast.Compare, ast.IfExp, ast.Subscript, ast.Slice, ast.JoinedStr, ast.FormattedValue)
_TYPE_EXPRESSION_NODES = (ast.Name, ast.Attribute, ast.Constant, ast.Subscript, ast.Tuple, ast.BinOp, ast.BitOr,
                          ast.expr_context)
_LITERAL_NODES = (ast.Constant, ast.Tuple, ast.List, ast.expr_context)
_DUNDER_TEXT = re.compile(r"__[A-Za-z]")


@dataclasses.dataclass(frozen=True)
class Rejection:
  reason: str
  message: str
  line: int | None = None

  def feedback(self) -> str:
    where = f" (line {self.line})" if self.line else ""
    return f"rejected by the static check [{self.reason}]{where}: {self.message}"


class _Found(Exception):
  def __init__(self, rejection: Rejection):
    super().__init__(rejection.message)
    self.rejection = rejection


def _reject(reason: str, message: str, node: ast.AST | None = None):
  raise _Found(Rejection(reason, message, getattr(node, "lineno", None)))


_AST_LOCK = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
  """`ast.parse` under a process-wide lock.

  The evaluator parses on several parent threads, and CPython 3.11's AST constructor keeps a global
  recursion counter that concurrent parses corrupt ("SystemError: AST constructor recursion depth
  mismatch"). Parent-process code of kernels_eval and probe parses through this function.
  """
  with _AST_LOCK:
    return ast.parse(source, filename=filename)


# Tokens that may open one more level of an expression tree; `,` `;` `:` `=` and closing brackets never do.
_FLAT_OPERATORS = frozenset({",", ";", ":", "=", ")", "]", "}"})
_OPENING = frozenset({"(", "[", "{"})
_CLOSING = frozenset({")", "]", "}"})
_NESTING_KEYWORDS = frozenset({"not", "lambda", "if", "else", "and", "or", "in", "is", "for", "await", "yield"})
_FSTRING_NESTING = re.compile(r"[-+*/%@&|^~<>!=.(\[{]|\b(?:not|lambda|if|else|and|or|in|is|for|await|yield)\b")


def _is_fstring(token: str) -> bool:
  quote = min(i for i in (token.find("'"), token.find('"'), len(token)) if i >= 0)
  return "f" in token[:quote].lower()


class _Nesting:
  """Running counts of one token scan; `exceeded` names the first limit passed."""

  def __init__(self):
    self.brackets = self.indent = self.operators = self.elifs = 0

  def add(self, tok: tokenize.TokenInfo):
    kind, text = tok.type, tok.string
    if kind == tokenize.OP:
      self.brackets += (text in _OPENING) - (text in _CLOSING)
      self.operators += text not in _FLAT_OPERATORS
    elif kind == tokenize.NAME:
      self.operators += text in _NESTING_KEYWORDS
      self.elifs += text == "elif"
    elif kind == tokenize.STRING and _is_fstring(text):
      self.operators += len(_FSTRING_NESTING.findall(text))
    elif kind in (tokenize.INDENT, tokenize.DEDENT):
      self.indent += 1 if kind == tokenize.INDENT else -1
    elif kind == tokenize.NEWLINE:
      self.operators = 0

  def exceeded(self) -> str | None:
    if self.brackets > MAX_BRACKET_DEPTH:
      return f"brackets nest more than {MAX_BRACKET_DEPTH} deep"
    if self.indent > MAX_INDENT_DEPTH:
      return f"blocks nest more than {MAX_INDENT_DEPTH} deep"
    if self.operators > MAX_STATEMENT_OPERATORS:
      return f"one statement has more than {MAX_STATEMENT_OPERATORS} operators; split it up"
    if self.elifs > MAX_ELIF_BRANCHES:
      return f"more than {MAX_ELIF_BRANCHES} `elif` branches"
    return None


def _scan_nesting(source: str) -> Rejection | None:
  """Bounds the depth of the tree `ast.parse` would build, in one linear pass over the tokens.

  Each level of an expression needs a token of its own (an operator, a dot, a bracket, a keyword), and
  statements nest only by indentation or `elif`, so the operators of one statement, the bracket and
  indentation depths and the `elif` count bound the tree. Text the tokenizer refuses is a syntax error
  (the tokens before the error kept within the limits, so the parser may be asked for its message).
  """
  counts = _Nesting()
  try:
    for tok in tokenize.generate_tokens(io.StringIO(source, newline=None).readline):
      counts.add(tok)
      problem = counts.exceeded()
      if problem:
        return Rejection("too_deeply_nested", f"the source is too deeply nested: {problem}", tok.start[0])
  except (tokenize.TokenError, SyntaxError) as e:
    return _tokenizer_error(source, e)
  return None


def _tokenizer_error(source: str, error: Exception) -> Rejection:
  """The parser's message for text the tokenizer refuses (the parser fails on it too), else the tokenizer's."""
  try:
    parse_python(source)
  except SyntaxError as e:
    return _syntax_rejection(e)
  except Exception:  # noqa: BLE001  (any failure to parse is the candidate's)
    pass
  if isinstance(error, SyntaxError):
    return _syntax_rejection(error)
  position = error.args[1] if len(error.args) > 1 else None
  line = position[0] if isinstance(position, tuple) and position and isinstance(position[0], int) else None
  return Rejection("syntax_error", str(error.args[0] if error.args else error), line)


def _syntax_rejection(e: SyntaxError) -> Rejection:
  text = (e.text or "").strip()
  return Rejection("syntax_error", f"{e.msg}" + (f": {text!r}" if text else ""), e.lineno)


def _too_deep(tree: ast.AST) -> ast.AST | None:
  """The first node deeper than MAX_AST_DEPTH, found without recursion; None if there is none."""
  stack = [(tree, 1)]
  while stack:
    node, depth = stack.pop()
    if depth > MAX_AST_DEPTH:
      return node
    stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
  return None


def _text_problem(source: object) -> Rejection | None:
  """Refuses what is not text of bounded size that Python could parse."""
  if not isinstance(source, str):
    return Rejection("syntax_error", f"the source must be text, not {type(source).__name__}")
  if len(source) > MAX_SOURCE_BYTES:
    return Rejection("source_too_large", f"source exceeds {MAX_SOURCE_BYTES} bytes")
  try:
    size = len(source.encode("utf-8"))
  except UnicodeEncodeError:
    return Rejection("syntax_error", "the source is not valid UTF-8 text (it holds a lone surrogate)")
  if size > MAX_SOURCE_BYTES:
    return Rejection("source_too_large", f"source exceeds {MAX_SOURCE_BYTES} bytes")
  if "\x00" in source:
    return Rejection("syntax_error", "the source contains a null byte")
  return None


def _parse(source: str, filename: str) -> ast.Module | Rejection:
  """The tree of `source`, or why it cannot be checked; never raises."""
  problem = _text_problem(source) or _scan_nesting(source)
  if problem is not None:
    return problem
  try:
    tree = parse_python(source, filename)
  except SyntaxError as e:
    return _syntax_rejection(e)
  except (RecursionError, MemoryError):
    return Rejection("too_deeply_nested", "the source is too complex to parse")
  except ValueError as e:
    return Rejection("syntax_error", str(e))
  deep = _too_deep(tree)
  if deep is not None:
    return Rejection("too_deeply_nested", f"the source nests more than {MAX_AST_DEPTH} levels deep",
                     getattr(deep, "lineno", None))
  return tree


def _import_reason(module: str) -> str:
  root = module.split(".")[0]
  return "network_access" if root in NETWORK_MODULES else "forbidden_import"


def _reachable_modules(allowed: frozenset[str]) -> frozenset[str]:
  """Modules an attribute chain may pass through: the allowed ones, their ancestors, ATTRIBUTE_MODULES."""
  reachable = {".".join(m.split(".")[:i]) for m in allowed for i in range(1, m.count(".") + 2)}
  reachable |= {m for m in ATTRIBUTE_MODULES if m.rsplit(".", 1)[0] in reachable}
  return frozenset(reachable)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def _parameters(args: ast.arguments) -> set[str]:
  names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
  return names | {a.arg for a in (args.vararg, args.kwarg) if a is not None}


def _bound_names(body: list[ast.stmt]) -> set[str]:
  """Names that statements bind in their own scope (targets, nested function names), not in nested scopes."""
  names: set[str] = set()
  stack: list[ast.AST] = list(body)
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
      names.add(node.id)
    if not isinstance(node, _SCOPES):
      stack.extend(ast.iter_child_nodes(node))
  return names


def _comprehension_targets(node: ast.AST) -> set[str]:
  return {n.id for gen in node.generators for n in ast.walk(gen.target) if isinstance(n, ast.Name)}


@dataclasses.dataclass
class _Scope:
  """Names bound in one scope. `at_import`: its code runs while the module is executed (module level
  and comprehensions there), where only names bound by earlier statements exist."""
  names: set[str]
  at_import: bool
  parent: _Scope | None = None


class _Checker(ast.NodeVisitor):
  """Walks a module; `allowed` are the importable modules, `preloaded` aliases the namespace already holds."""

  def __init__(self, allowed: frozenset[str], preloaded: dict[str, str]):
    self.allowed = allowed
    self.reachable = _reachable_modules(allowed | frozenset(preloaded.values()))
    self.aliases = dict(preloaded)
    self.module = _Scope(set(preloaded), at_import=True)
    self.seen = set(preloaded)  # module-level names bound by the statements checked so far
    self.scope = self.module

  # Scopes and names.
  def _lookup(self, name: str) -> str:
    """Where a load of `name` resolves: 'function' (a variable of an enclosing function), 'alias',
    'module' or 'builtin'."""
    scope = self.scope
    while scope is not self.module:
      if name in scope.names:
        return "function"
      scope = scope.parent
    if name not in (self.seen if self.scope.at_import else self.module.names):
      return "builtin"
    return "alias" if name in self.aliases else "module"

  def _push(self, names: set[str], at_import: bool, node: ast.AST):
    shadowed = sorted(names & self.aliases.keys())
    if shadowed:
      _reject("shadowed_import", f"`{shadowed[0]}` is an import and cannot be rebound", node)
    for name in names:
      self._check_identifier(name, node)
    self.scope = _Scope(names, at_import, self.scope)

  def _pop(self):
    self.scope = self.scope.parent

  @staticmethod
  def _check_identifier(name: str, node: ast.AST):
    if name.startswith("__"):
      _reject("dunder_access", f"the name {name!r} is not allowed", node)

  def _check_builtin(self, name: str, node: ast.AST):
    if name in ALLOWED_BUILTINS:
      return
    if name in FORBIDDEN_NAMES or hasattr(builtins, name):
      _reject("forbidden_builtin", f"the builtin {name!r} is not allowed (allowed: "
              f"{', '.join(sorted(ALLOWED_BUILTINS))})", node)
    _reject("undefined_name", f"{name!r} is not defined", node)

  # Modules and attributes.
  def _module_path(self, node: ast.AST) -> str | None:
    """The module `node` names (an import alias or a chain of submodules), None if it is not a module."""
    if isinstance(node, ast.Name):
      target = self.aliases.get(node.id) if self._lookup(node.id) == "alias" else None
      return target if target in MODULE_ATTRIBUTES else None
    if isinstance(node, ast.Attribute):
      base = self._module_path(node.value)
      path = f"{base}.{node.attr}" if base else None
      return path if path in MODULE_ATTRIBUTES else None
    return None

  def _qualified(self, node: ast.AST) -> str | None:
    """`module.name` of a callee, an imported object's origin or an allowed builtin's name; None otherwise."""
    if isinstance(node, ast.Name):
      where = self._lookup(node.id)
      if where == "alias":
        return self.aliases[node.id]
      return node.id if where == "builtin" else None
    if isinstance(node, ast.Attribute):
      base = self._module_path(node.value)
      return f"{base}.{node.attr}" if base else None
    return None

  @staticmethod
  def _check_attribute_name(name: str, node: ast.AST):
    """The refusals by name, each with its own code; the allow-lists decide the rest."""
    if name in ("format", "format_map"):
      _reject("format_string", f"`.{name}` is not allowed: format fields look attributes and items up by name "
              "(use an f-string)", node)
    if name.startswith("__"):
      _reject("dunder_access", f"access to {name!r} is not allowed", node)
    if name.startswith("_"):
      _reject("private_access", f"access to the private name {name!r} is not allowed", node)
    if name in FORBIDDEN_ATTRS:
      _reject("forbidden_api", f"{name!r} is not allowed in kernel code", node)

  def _check_module_attribute(self, module: str, name: str, node: ast.AST):
    self._check_attribute_name(name, node)
    path = f"{module}.{name}"
    if name not in MODULE_ATTRIBUTES[module] or (path in MODULE_ATTRIBUTES and path not in self.reachable):
      _reject("forbidden_attribute", f"`{path}` is not in the allow-list of kernel code", node)

  def _check_module_chain(self, node: ast.AST):
    """Checks `a.b.c` where every prefix names a module (the base of an attribute access)."""
    if isinstance(node, ast.Attribute):
      self._check_module_attribute(self._module_path(node.value), node.attr, node)
      self._check_module_chain(node.value)

  # Imports.
  def _bind_alias(self, name: str, target: str, node: ast.AST):
    self._check_identifier(name, node)
    if self.aliases.get(name, target) != target or name in self.module.names - self.aliases.keys():
      _reject("shadowed_import", f"`{name}` names two different things", node)
    self.aliases[name] = target

  def _check_module(self, module: str, node: ast.AST):
    if module not in self.allowed:
      _reject(_import_reason(module), f"import of {module!r} is not allowed (allowed: "
              f"{', '.join(sorted(self.allowed))})", node)

  def _register_import(self, node: ast.Import | ast.ImportFrom):
    if isinstance(node, ast.Import):
      for alias in node.names:
        self._check_module(alias.name, node)
        root = alias.name.split(".")[0]
        self._bind_alias(alias.asname or root, alias.name if alias.asname else root, node)
      return
    if node.level or node.module is None:
      _reject("forbidden_import", "relative imports are not allowed", node)
    for alias in node.names:
      full = f"{node.module}.{alias.name}"
      if alias.name == "*":
        _reject("forbidden_import", f"`from {node.module} import *` is not allowed", node)
      if full not in self.allowed:
        self._check_module(node.module, node)
        if node.module in MODULE_ATTRIBUTES:
          self._check_module_attribute(node.module, alias.name, node)
        else:
          self._check_attribute_name(alias.name, node)
      self._bind_alias(alias.asname or alias.name, full, node)

  # Module level: what runs at import.
  def check_module(self, tree: ast.Module):
    self.module.names |= _bound_names(tree.body)
    for node in tree.body:
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        self._register_import(node)
    self.module.names |= self.aliases.keys()
    for node in tree.body:
      self._check_kind(node)
      self._check_at_import(node)
      self.visit(node)
      self.seen |= _bound_names([node]) | self._import_names(node)

  @staticmethod
  def _import_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Import):
      return {a.asname or a.name.split(".")[0] for a in node.names}
    if isinstance(node, ast.ImportFrom):
      return {a.asname or a.name for a in node.names}
    return set()

  def _check_at_import(self, node: ast.stmt):
    """Module level holds imports, docstrings, `pass`, function definitions, asserts and constants."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.Pass)):
      return
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
      return
    if isinstance(node, ast.FunctionDef):
      for decorator in node.decorator_list:
        self._check_decorator(decorator)
      self._check_type_expressions([a.annotation for a in _all_args(node.args)] + [node.returns])
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      self._check_module_assignment(node)
    elif isinstance(node, ast.Assert):
      self._check_import_time_values([node.test, node.msg])
    elif isinstance(node, ast.AugAssign):
      _reject("mutable_global_state", "module-level augmented assignment is not allowed", node)
    else:
      _reject("code_at_import", f"a top-level `{type(node).__name__}` statement runs at import: module level may "
              "only hold imports, constants and function definitions", node)

  def _check_module_assignment(self, node: ast.Assign | ast.AnnAssign):
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for target in targets:
      for n in ast.walk(target):
        if isinstance(n, (ast.Attribute, ast.Subscript)):
          _reject("mutable_global_state", "module-level assignments may only bind names (no state may "
                  "persist across calls)", node)
    if isinstance(node, ast.AnnAssign):
      self._check_type_expressions([node.annotation])
    self._check_import_time_values([node.value])

  def _check_import_time_values(self, values: list[ast.expr | None]):
    for value in values:
      if value is not None:
        self._check_import_time_value(value)

  def _check_import_time_value(self, node: ast.expr):
    """A module-level value: literals, names, module attributes, arithmetic, lambdas and IMPORT_TIME_CALLS."""
    if isinstance(node, _MUTABLE_VALUES):
      _reject("mutable_global_state", "module-level values must be immutable (no list, dict, set or "
              "comprehension: no state may persist across calls)", node)
    if isinstance(node, ast.Lambda):
      return
    if isinstance(node, ast.Call):
      name = self._qualified(node.func)
      if name not in IMPORT_TIME_CALLS:
        _reject("code_at_import", f"the call `{_excerpt(node.func)}(...)` would run at import; module-level "
                "calls are limited to pure constructors such as functools.partial, jnp.float32 and math "
                "functions", node)
      self._check_import_time_values(node.args + [kw.value for kw in node.keywords])
      return
    if not isinstance(node, _IMPORT_TIME_NODES):
      _reject("code_at_import", f"a module-level `{type(node).__name__}` is not allowed", node)
    if isinstance(node, ast.Subscript) and self._qualified(node.value) is not None:
      _reject("code_at_import", f"indexing `{_excerpt(node.value)}` at module level would run it at import", node)
    self._check_import_time_values([c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)])

  def _is_jit_partial(self, node: ast.expr) -> bool:
    """`functools.partial(jax.jit, static_argnums=<literal>, static_argnames=<literal>)`."""
    return (isinstance(node, ast.Call) and self._qualified(node.func) == "functools.partial"
            and len(node.args) == 1 and self._qualified(node.args[0]) == "jax.jit"
            and all(kw.arg in JIT_DECORATOR_KWARGS for kw in node.keywords)
            and all(isinstance(n, _LITERAL_NODES) for kw in node.keywords for n in ast.walk(kw.value)))

  def _check_decorator(self, node: ast.expr):
    """A module-level decorator runs at import: only `jax.jit` and `functools.partial(jax.jit, static_...)`."""
    if self._qualified(node) != "jax.jit" and not self._is_jit_partial(node):
      _reject("decorator_at_import", f"the decorator `@{_excerpt(node)}` would run at import; module-level "
              "functions may only be decorated with jax.jit or functools.partial(jax.jit, static_argnums=..., "
              "static_argnames=...)", node)

  @staticmethod
  def _check_type_expressions(annotations: list[ast.expr | None]):
    for annotation in annotations:
      for n in ast.walk(annotation) if annotation is not None else ():
        if not isinstance(n, _TYPE_EXPRESSION_NODES) or (isinstance(n, ast.BinOp) and not isinstance(n.op, ast.BitOr)):
          _reject("code_at_import", "module-level annotations are evaluated at import: use names, attributes "
                  "and subscripts only", annotation)

  # Every node.
  @staticmethod
  def _check_kind(node: ast.AST):
    kind = type(node).__name__
    if kind in REFUSED_CONSTRUCTS:
      _reject(*REFUSED_CONSTRUCTS[kind], node)
    if not isinstance(node, _ALLOWED_NODES):
      _reject("forbidden_construct", f"`{kind}` is not allowed in kernel code", node)

  def visit(self, node: ast.AST):
    self._check_kind(node)
    return super().visit(node)

  def visit_Import(self, node: ast.Import):
    if self.scope is not self.module:
      _reject("forbidden_import", "imports belong at module level", node)

  visit_ImportFrom = visit_Import

  def visit_Name(self, node: ast.Name):
    self._check_identifier(node.id, node)
    if not isinstance(node.ctx, ast.Load):
      return
    where = self._lookup(node.id)
    if where == "builtin":
      self._check_builtin(node.id, node)
    elif where == "alias" and self.aliases[node.id] in MODULE_ATTRIBUTES:
      _reject("module_as_value", f"the module `{node.id}` may only be used as `{node.id}.name`", node)

  def visit_Attribute(self, node: ast.Attribute):
    self._check_attribute_name(node.attr, node)
    if not isinstance(node.ctx, ast.Load):
      _reject("mutable_global_state", "assigning attributes is not allowed (no state outside function "
              "locals and kernel refs)", node)
    path = self._module_path(node)
    if path is not None:
      _reject("module_as_value", f"the module `{path}` may only be used as the base of an attribute", node)
    module = self._module_path(node.value)
    if module is not None:
      self._check_module_attribute(module, node.attr, node)
      self._check_module_chain(node.value)
      return
    self.visit(node.value)
    if node.attr not in VALUE_ATTRIBUTES:
      _reject("forbidden_attribute", f"the attribute `.{node.attr}` is not in the allow-list of kernel code", node)

  def visit_Subscript(self, node: ast.Subscript):
    if not isinstance(node.ctx, ast.Load):
      root = node.value
      while isinstance(root, (ast.Subscript, ast.Attribute)):
        root = root.value
      if not (isinstance(root, ast.Name) and self._lookup(root.id) == "function"):
        _reject("mutable_global_state", "item assignment is only allowed into a function's own variables "
                "(e.g. `o_ref[...] = v`): no state may persist across calls", node)
    self.generic_visit(node)

  def visit_Constant(self, node: ast.Constant):
    text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
    if isinstance(text, str) and _DUNDER_TEXT.search(text):
      _reject("dunder_access", "strings naming dunder attributes are not allowed", node)

  def visit_Call(self, node: ast.Call):
    for kw in node.keywords:
      if kw.arg in HARNESS_KWARGS:
        _reject("harness_option", f"do not pass `{kw.arg}=`: the harness selects interpret mode on CPU "
                "and the Triton lowering on GPU", node)
      if kw.arg is not None:
        self._check_identifier(kw.arg, node)
    self.generic_visit(node)

  def visit_Dict(self, node: ast.Dict):
    for key in node.keys:
      if isinstance(key, ast.Constant) and key.value in HARNESS_KWARGS:
        _reject("harness_option", f"do not pass `{key.value}`: the harness selects the mode", node)
    self.generic_visit(node)

  # Functions and comprehensions.
  def _visit_signature(self, args: ast.arguments):
    """Defaults and annotations, evaluated in the enclosing scope; defaults hold no state."""
    for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
      if any(isinstance(n, _MUTABLE_VALUES + (ast.Call,)) for n in ast.walk(default)):
        _reject("mutable_global_state", "default arguments must be constants (a mutable or computed default "
                "keeps state across calls)", default)
      self.visit(default)
    for arg in _all_args(args):
      if arg.annotation is not None:
        self.visit(arg.annotation)

  def visit_FunctionDef(self, node: ast.FunctionDef):
    self._check_identifier(node.name, node)
    for decorator in node.decorator_list:
      self.visit(decorator)
    self._visit_signature(node.args)
    if node.returns is not None:
      self.visit(node.returns)
    self._push(_parameters(node.args) | _bound_names(node.body), False, node)
    for stmt in node.body:
      self.visit(stmt)
    self._pop()

  def visit_Lambda(self, node: ast.Lambda):
    self._visit_signature(node.args)
    self._push(_parameters(node.args), False, node)
    self.visit(node.body)
    self._pop()

  def _visit_comprehension(self, node: ast.AST, parts: list[ast.expr]):
    """The first iterable belongs to the enclosing scope; targets, conditions and the rest to the comprehension's."""
    generators = node.generators
    self.visit(generators[0].iter)
    self._push(_comprehension_targets(node), self.scope.at_import, node)
    for i, gen in enumerate(generators):
      if gen.is_async:
        _reject("forbidden_construct", "async code is not allowed", node)
      self.visit(gen.target)
      if i:
        self.visit(gen.iter)
      for condition in gen.ifs:
        self.visit(condition)
    for part in parts:
      self.visit(part)
    self._pop()

  def visit_ListComp(self, node: ast.ListComp):
    self._visit_comprehension(node, [node.elt])

  visit_SetComp = visit_GeneratorExp = visit_ListComp

  def visit_DictComp(self, node: ast.DictComp):
    self._visit_comprehension(node, [node.key, node.value])


def _excerpt(node: ast.AST) -> str:
  text = ast.unparse(node)
  return text if len(text) <= 60 else text[:57] + "..."


def _all_args(args: ast.arguments) -> list[ast.arg]:
  return args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a is not None]


def _check_tree(tree: ast.Module, allowed: frozenset[str], preloaded: dict[str, str]) -> Rejection | None:
  """Runs the checker on a parsed, depth-bounded tree; every exception becomes a Rejection."""
  try:
    _Checker(allowed, preloaded).check_module(tree)
  except _Found as f:
    return f.rejection
  except RecursionError:
    return Rejection("too_deeply_nested", "the source is too deeply nested to check")
  except Exception as e:  # noqa: BLE001  (fail closed: a source the checker cannot judge is refused)
    return Rejection("static_check_failed", f"the static check could not process this source ({type(e).__name__})")
  return None


def _check_source(source: str, allowed: frozenset[str], filename: str,
                  preloaded: dict[str, str]) -> ast.Module | Rejection:
  """The checked tree of `source`, or its Rejection; never raises."""
  try:
    tree = _parse(source, filename)
    if isinstance(tree, Rejection):
      return tree
    return _check_tree(tree, allowed, preloaded) or tree
  except Exception as e:  # noqa: BLE001
    return Rejection("static_check_failed", f"the static check could not process this source ({type(e).__name__})")


def check_python(source: str, allowed: frozenset[str], *, filename: str = "solution.py") -> Rejection | None:
  """All rules of the module docstring, with `allowed` the importable modules."""
  checked = _check_source(source, allowed, filename, {})
  return checked if isinstance(checked, Rejection) else None


def _solution_problem(tree: ast.Module, input_names: list[str]) -> Rejection | None:
  defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "solution"]
  assigned = [n for n in tree.body if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "solution" for t in n.targets)]
  if not defs and not assigned:
    return Rejection("missing_solution", "define a top-level function `solution("
                     f"{', '.join(input_names)})` that returns the output array")
  if defs:
    args = defs[-1].args
    positional = [a.arg for a in args.posonlyargs + args.args]
    required = len(positional) - len(args.defaults)
    if required > len(input_names) or (len(positional) < len(input_names) and not args.vararg):
      return Rejection("bad_signature", f"`solution` must take the inputs ({', '.join(input_names)}) in "
                       f"order; it takes ({', '.join(positional)})", defs[-1].lineno)
  return None


def check_pallas_candidate(source: str, input_names: list[str]) -> Rejection | None:
  """All rules above, plus: a top-level `solution` taking the task's inputs in order."""
  checked = _check_source(source, PALLAS_MODULES, "solution.py", {})
  if isinstance(checked, Rejection):
    return checked
  try:
    return _solution_problem(checked, list(input_names))
  except Exception as e:  # noqa: BLE001
    return Rejection("static_check_failed", f"the static check could not process this source ({type(e).__name__})")


def check_reference(source: str) -> Rejection | None:
  """Checks a task's `reference` function (untrusted tasks): the jax/jnp/lax/math allow-list, with those
  four names predefined as the reference runner defines them."""
  checked = _check_source(source, REFERENCE_MODULES, "reference.py", _REFERENCE_ALIASES)
  return checked if isinstance(checked, Rejection) else None
