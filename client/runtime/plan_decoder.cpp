// The ExecutionPlan decoder: a bounds-checked reader of protobuf's wire format and one function
// per message of the plan, each reading its fields by number.
#include "runtime/plan_decoder.h"

#include <bit>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace kiln::runtime {
namespace {

enum WireType : int {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// How deep groups may nest inside an unknown field: past protobuf's own recursion limit (100, for
// messages and groups together), so that nothing protobuf reads is refused here.
constexpr int kMaxGroupDepth = 200;

// Errors are built from the innermost read outwards: the read says where ("at byte 12: ..."),
// each enclosing message adds its field's name in front. Nothing is formatted on success.
Status At(size_t offset, const char* what) {
  return Status::InvalidArgument(": at byte " + std::to_string(offset) + ": " + what);
}

Status In(const Status& status, std::string_view field) {
  if (status.ok()) return status;
  const bool leaf = !status.message().empty() && status.message()[0] == ':';
  return status.Prefixed(std::string(field) + (leaf ? "" : "."));
}

Status In(const Status& status, std::string_view field, size_t index) {
  if (status.ok()) return status;
  return In(status, std::string(field) + "[" + std::to_string(index) + "]");
}

// One message's bytes. Every read checks the message's end first; offsets in errors count from
// the start of the whole plan.
class Reader {
 public:
  Reader(std::string_view bytes, const char* origin)
      : p_(bytes.data()), end_(bytes.data() + bytes.size()), origin_(origin) {}

  bool done() const { return p_ == end_; }
  size_t offset() const { return static_cast<size_t>(p_ - origin_); }

  Status Varint(uint64_t* value) {
    const size_t start = offset();
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return At(start, "truncated varint");
      const auto byte = static_cast<uint8_t>(*p_++);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;  // Bits past 64 drop, as protobuf's.
      if ((byte & 0x80) == 0) {
        *value = v;
        return Status::OK();
      }
    }
    return At(start, "varint longer than 10 bytes");
  }

  Status Fixed(size_t width, uint64_t* value) {
    if (static_cast<size_t>(end_ - p_) < width) return At(offset(), "truncated fixed-width field");
    uint64_t v = 0;
    for (size_t i = 0; i < width; ++i)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(p_[i])) << (8 * i);
    p_ += width;
    *value = v;
    return Status::OK();
  }

  // A length-delimited field's bytes.
  Status Delimited(std::string_view* bytes) {
    const size_t start = offset();
    uint64_t length = 0;
    KILN_RETURN_IF_ERROR(Varint(&length));
    if (length > static_cast<uint64_t>(end_ - p_)) {
      return At(start, "length runs past the end of its message");
    }
    *bytes = std::string_view(p_, static_cast<size_t>(length));
    p_ += length;
    return Status::OK();
  }

  // The next field's number and wire type (never kEndGroup: only SkipGroup expects one).
  Status Tag(uint32_t* field, int* wire_type) {
    const size_t start = offset();
    KILN_RETURN_IF_ERROR(AnyTag(field, wire_type));
    if (*wire_type == kEndGroup) return At(start, "end of a group that was not started");
    return Status::OK();
  }

  // Skips the value of an unknown field (or of a known one sent with another wire type).
  Status Skip(uint32_t field, int wire_type, int depth = 0) {
    uint64_t ignored = 0;
    std::string_view bytes;
    switch (wire_type) {
      case kVarint:
        return Varint(&ignored);
      case kFixed64:
        return Fixed(8, &ignored);
      case kFixed32:
        return Fixed(4, &ignored);
      case kLengthDelimited:
        return Delimited(&bytes);
      case kStartGroup:
        return SkipGroup(field, depth + 1);
      default:
        return At(offset(), "invalid wire type");
    }
  }

  // A reader of `bytes`, a field inside this reader's message.
  Reader Nested(std::string_view bytes) const { return Reader(bytes, origin_); }

 private:
  // A tag is a varint of at most 5 bytes whose bits past 32 are dropped, as protobuf reads it.
  Status AnyTag(uint32_t* field, int* wire_type) {
    const size_t start = offset();
    uint32_t tag = 0;
    for (int shift = 0;; shift += 7) {
      if (shift > 28) return At(start, "tag longer than 5 bytes");
      if (p_ == end_) return At(start, "truncated tag");
      const auto byte = static_cast<uint8_t>(*p_++);
      tag |= static_cast<uint32_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) break;
    }
    if ((tag >> 3) == 0) return At(start, "invalid field number");
    *field = tag >> 3;
    *wire_type = static_cast<int>(tag & 7);
    if (*wire_type > kFixed32) return At(start, "invalid wire type");
    return Status::OK();
  }

  // The fields of a group up to its end, whose number must be the group's.
  Status SkipGroup(uint32_t group, int depth) {
    if (depth > kMaxGroupDepth) return At(offset(), "groups nest too deep");
    while (true) {
      if (done()) return At(offset(), "truncated group");
      const size_t start = offset();
      uint32_t field = 0;
      int wire_type = 0;
      KILN_RETURN_IF_ERROR(AnyTag(&field, &wire_type));
      if (wire_type == kEndGroup) {
        if (field != group) return At(start, "group ends with another field's number");
        return Status::OK();
      }
      KILN_RETURN_IF_ERROR(Skip(field, wire_type, depth));
    }
  }

  const char* p_;
  const char* end_;
  const char* origin_;
};

// The reads of one field's value by the type .proto declares; a value with another wire type is
// an unknown field (protobuf's rule) and is skipped.
Status ReadVarint(Reader& r, int wire_type, uint32_t field, uint64_t* value, bool* present) {
  *present = wire_type == kVarint;
  if (!*present) return r.Skip(field, wire_type);
  return r.Varint(value);
}

// A varint as protobuf converts it to a field's type: the low 32 bits for 32-bit types (enums
// are int32), nonzero for bool.
template <typename T>
T FromVarint(uint64_t v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else if constexpr (std::is_enum_v<T>) {
    return static_cast<T>(static_cast<int32_t>(static_cast<uint32_t>(v)));
  } else if constexpr (sizeof(T) == 4) {
    return static_cast<T>(static_cast<uint32_t>(v));
  } else {
    return static_cast<T>(v);
  }
}

// A singular varint field: uint32, int32, an enum, int64, uint64 or bool.
template <typename T>
Status ReadScalar(Reader& r, int wire_type, uint32_t field, T* out) {
  uint64_t v = 0;
  bool present = false;
  KILN_RETURN_IF_ERROR(ReadVarint(r, wire_type, field, &v, &present));
  if (present) *out = FromVarint<T>(v);
  return Status::OK();
}

Status ReadDouble(Reader& r, int wire_type, uint32_t field, double* out, bool* present) {
  *present = wire_type == kFixed64;
  if (!*present) return r.Skip(field, wire_type);
  uint64_t bits = 0;
  KILN_RETURN_IF_ERROR(r.Fixed(8, &bits));
  *out = std::bit_cast<double>(bits);
  return Status::OK();
}

// A string, bytes or message field: its bytes, or present = false for another wire type.
Status ReadDelimited(Reader& r, int wire_type, uint32_t field, std::string_view* out,
                     bool* present) {
  *present = wire_type == kLengthDelimited;
  if (!*present) return r.Skip(field, wire_type);
  return r.Delimited(out);
}

Status ReadString(Reader& r, int wire_type, uint32_t field, std::string* out) {
  std::string_view bytes;
  bool present = false;
  KILN_RETURN_IF_ERROR(ReadDelimited(r, wire_type, field, &bytes, &present));
  if (present) out->assign(bytes);
  return Status::OK();
}

// A repeated integer field, one element (unpacked) or a packed run of them.
template <typename T>
Status ReadRepeated(Reader& r, int wire_type, uint32_t field, std::vector<T>* out) {
  if (wire_type == kVarint) {
    uint64_t v = 0;
    KILN_RETURN_IF_ERROR(r.Varint(&v));
    out->push_back(FromVarint<T>(v));
    return Status::OK();
  }
  if (wire_type != kLengthDelimited) return r.Skip(field, wire_type);
  std::string_view packed;
  KILN_RETURN_IF_ERROR(r.Delimited(&packed));
  Reader elements = r.Nested(packed);
  while (!elements.done()) {
    uint64_t v = 0;
    KILN_RETURN_IF_ERROR(elements.Varint(&v));
    out->push_back(FromVarint<T>(v));
  }
  return Status::OK();
}

// A message field: `nested` set to a reader of its bytes, or left empty when the field had another
// wire type (it was skipped as unknown).
Status OpenMessage(Reader& r, int wire_type, uint32_t field, std::optional<Reader>* nested) {
  std::string_view bytes;
  bool present = false;
  KILN_RETURN_IF_ERROR(ReadDelimited(r, wire_type, field, &bytes, &present));
  if (present) nested->emplace(r.Nested(bytes));
  return Status::OK();
}

// Decodes a singular message field with `decode`, merging into `out` as protobuf merges one that
// appears twice.
template <typename T, typename Decode>
Status ReadMessage(Reader& r, int wire_type, uint32_t field, T* out, Decode decode) {
  std::optional<Reader> nested;
  KILN_RETURN_IF_ERROR(OpenMessage(r, wire_type, field, &nested));
  return nested ? decode(*nested, out) : Status::OK();
}

// A repeated message field: one more element, decoded from this occurrence.
template <typename T, typename Decode>
Status AppendMessage(Reader& r, int wire_type, uint32_t field, std::vector<T>* out,
                     const char* name, Decode decode) {
  std::optional<Reader> nested;
  KILN_RETURN_IF_ERROR(OpenMessage(r, wire_type, field, &nested));
  if (!nested) return Status::OK();
  T element{};
  KILN_RETURN_IF_ERROR(In(decode(*nested, &element), name, out->size()));
  out->push_back(std::move(element));
  return Status::OK();
}

// Runs `on_field(field, wire_type)` for every field of the message in `r`.
template <typename OnField>
Status ForEachField(Reader& r, OnField on_field) {
  while (!r.done()) {
    uint32_t field = 0;
    int wire_type = 0;
    KILN_RETURN_IF_ERROR(r.Tag(&field, &wire_type));
    KILN_RETURN_IF_ERROR(on_field(field, wire_type));
  }
  return Status::OK();
}

// ---- kiln.v1 messages (graph.proto, artifact.proto), by field number ----

Status DecodeDevice(Reader& r, DeviceSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) {
    switch (field) {
      case 1:
        return ReadScalar(r, wire_type, field, &out->kind);
      case 2:
        return ReadScalar(r, wire_type, field, &out->index);
      default:
        return r.Skip(field, wire_type);
    }
  });
}

Status DecodeTerm(Reader& r, SymTermSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    switch (field) {
      case 1:
        return ReadScalar(r, wire_type, field, &out->coefficient);
      case 2:
        return In(ReadRepeated(r, wire_type, field, &out->symbols), "symbols");
      default:
        return r.Skip(field, wire_type);
    }
  });
}

Status DecodeSymExpr(Reader& r, SymExprSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    return field == 1 ? AppendMessage(r, wire_type, field, &out->terms, "terms", DecodeTerm)
                      : r.Skip(field, wire_type);
  });
}

Status DecodeSymExprList(Reader& r, std::vector<SymExprSpec>* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    return field == 1 ? AppendMessage(r, wire_type, field, out, "values", DecodeSymExpr)
                      : r.Skip(field, wire_type);
  });
}

Status DecodeSizeSymbol(Reader& r, SizeSymbolSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    switch (field) {
      case 1:
        return ReadScalar(r, wire_type, field, &out->id);
      case 2:
        return ReadScalar(r, wire_type, field, &out->input);
      case 3:
        return ReadScalar(r, wire_type, field, &out->dim);
      case 4:
        return ReadScalar(r, wire_type, field, &out->min);
      case 5:
        return ReadScalar(r, wire_type, field, &out->max);
      default:
        return r.Skip(field, wire_type);
    }
  });
}

Status DecodeMeta(Reader& r, MetaSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    switch (field) {
      case 1:
        return ReadScalar(r, wire_type, field, &out->dtype);
      case 2:
        return In(ReadRepeated(r, wire_type, field, &out->sizes), "sizes");
      case 3:
        return In(ReadRepeated(r, wire_type, field, &out->strides), "strides");
      case 5:
        return ReadScalar(r, wire_type, field, &out->storage_offset);
      case 7:
        return AppendMessage(r, wire_type, field, &out->size_exprs, "size_exprs", DecodeSymExpr);
      case 8:
        return AppendMessage(r, wire_type, field, &out->stride_exprs, "stride_exprs",
                             DecodeSymExpr);
      case 9:
        // A singular message kept as at most one element: a second occurrence merges into
        // the first, as protobuf's parser merges it (ReadMessage).
        return In(ReadMessage(r, wire_type, field, &out->storage_offset_expr,
                              [](Reader& nested, std::vector<SymExprSpec>* exprs) {
                                if (exprs->empty()) exprs->emplace_back();
                                return DecodeSymExpr(nested, &exprs->front());
                              }),
                  "storage_offset_expr");
      default:  // 4 device, 6 requires_grad: a plan runs on one device, for inference.
        return r.Skip(field, wire_type);
    }
  });
}

Status DecodeValue(Reader& r, ValueSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    switch (field) {
      case 1:
        return ReadScalar(r, wire_type, field, &out->id);
      case 2:
        return In(ReadMessage(r, wire_type, field, &out->meta, DecodeMeta), "meta");
      default:
        return r.Skip(field, wire_type);
    }
  });
}

Status DecodeConstant(Reader& r, ConstantSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    switch (field) {
      case 1:
        return In(ReadMessage(r, wire_type, field, &out->value, DecodeValue), "value");
      case 2: {
        std::string_view data;
        bool present = false;
        KILN_RETURN_IF_ERROR(ReadDelimited(r, wire_type, field, &data, &present));
        if (present) out->data = data;
        return Status::OK();
      }
      default:
        return r.Skip(field, wire_type);
    }
  });
}

// Argument's payload is a oneof: a field of another member clears what the previous one set (as
// protobuf's oneof does); the same member again overwrites a number or merges into a message.
void Become(CallArg* arg, CallArg::Kind kind) {
  if (arg->kind == kind) return;
  CallArg fresh;
  fresh.name = std::move(arg->name);
  fresh.kind = kind;
  *arg = std::move(fresh);
}

Status DecodeIntList(Reader& r, std::vector<int64_t>* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) {
    return field == 1 ? ReadRepeated(r, wire_type, field, out) : r.Skip(field, wire_type);
  });
}

Status DecodeValueList(Reader& r, std::vector<int64_t>* out) {
  std::vector<uint32_t> ids;
  KILN_RETURN_IF_ERROR(ForEachField(r, [&](uint32_t field, int wire_type) {
    return field == 1 ? ReadRepeated(r, wire_type, field, &ids) : r.Skip(field, wire_type);
  }));
  out->insert(out->end(), ids.begin(), ids.end());
  return Status::OK();
}

Status DecodeNone(Reader& r) {
  return ForEachField(r, [&](uint32_t field, int wire_type) { return r.Skip(field, wire_type); });
}

// Argument's payload is a oneof. A member is taken only when its field has the member's wire
// type (otherwise the field was skipped as unknown).
Status DecodeArgument(Reader& r, CallArg* out) {
  using K = CallArg::Kind;
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    uint64_t v = 0;
    bool present = false;
    std::optional<Reader> nested;
    switch (field) {
      case 1:
        return ReadString(r, wire_type, field, &out->name);
      case 2:   // value: uint32
      case 3:   // int_value: int64
      case 5:   // bool_value
      case 8:   // dtype_value: an enum, int32 on the wire
      case 12:  // memory_format_value
      case 13:  // layout_value
        KILN_RETURN_IF_ERROR(ReadVarint(r, wire_type, field, &v, &present));
        if (!present) return Status::OK();
        if (field == 2) {
          Become(out, K::kValue);
          out->i = FromVarint<uint32_t>(v);
        } else if (field == 3) {
          Become(out, K::kInt);
          out->i = FromVarint<int64_t>(v);
        } else if (field == 5) {
          Become(out, K::kBool);
          out->b = FromVarint<bool>(v);
        } else {
          Become(out, field == 8 ? K::kDtype : field == 12 ? K::kMemoryFormat : K::kLayout);
          out->i = FromVarint<int32_t>(v);
        }
        return Status::OK();
      case 4: {  // float_value
        double f = 0;
        KILN_RETURN_IF_ERROR(ReadDouble(r, wire_type, field, &f, &present));
        if (present) {
          Become(out, K::kFloat);
          out->f = f;
        }
        return Status::OK();
      }
      case 10: {  // string_value
        std::string_view bytes;
        KILN_RETURN_IF_ERROR(ReadDelimited(r, wire_type, field, &bytes, &present));
        if (present) {
          Become(out, K::kStr);
          out->s.assign(bytes);
        }
        return Status::OK();
      }
      case 6:   // int_list
      case 7:   // value_list
      case 9:   // none
      case 11:  // device_value
      case 14:  // sym_int_value
      case 15:  // sym_int_list
        KILN_RETURN_IF_ERROR(OpenMessage(r, wire_type, field, &nested));
        if (!nested) return Status::OK();
        if (field == 14) {
          Become(out, K::kSymInt);
          out->exprs.resize(1);  // a message field met again merges into the one expression
          return In(DecodeSymExpr(*nested, &out->exprs[0]), "sym_int_value");
        }
        if (field == 15) {
          Become(out, K::kSymInts);
          return In(DecodeSymExprList(*nested, &out->exprs), "sym_int_list");
        }
        if (field == 6) {
          Become(out, K::kInts);
          return In(DecodeIntList(*nested, &out->list), "int_list");
        }
        if (field == 7) {
          Become(out, K::kValues);
          return In(DecodeValueList(*nested, &out->list), "value_list");
        }
        if (field == 9) {
          Become(out, K::kNone);
          return In(DecodeNone(*nested), "none");
        }
        Become(out, K::kDevice);
        return In(DecodeDevice(*nested, &out->device), "device_value");
      default:
        return r.Skip(field, wire_type);
    }
  });
}

Status DecodeKernel(Reader& r, KernelStepSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    switch (field) {
      case 1:
        return ReadString(r, wire_type, field, &out->symbol);
      case 2:
        return In(ReadRepeated(r, wire_type, field, &out->args), "args");
      case 3:
        return In(ReadRepeated(r, wire_type, field, &out->grid), "grid");
      case 4:
        return In(ReadRepeated(r, wire_type, field, &out->block), "block");
      case 5:
        return ReadScalar(r, wire_type, field, &out->shared_memory_bytes);
      case 6:
        return In(ReadRepeated(r, wire_type, field, &out->writes), "writes");
      case 7:
        return AppendMessage(r, wire_type, field, &out->size_args, "size_args", DecodeSymExpr);
      case 8: {
        std::optional<Reader> nested;
        KILN_RETURN_IF_ERROR(OpenMessage(r, wire_type, field, &nested));
        if (!nested) return Status::OK();
        out->has_grid_work = true;
        return In(DecodeSymExpr(*nested, &out->grid_work), "grid_work");
      }
      case 9:
        return ReadScalar(r, wire_type, field, &out->grid_work_per_block);
      case 10:
        return ReadScalar(r, wire_type, field, &out->grid_max);
      default:
        return r.Skip(field, wire_type);
    }
  });
}

Status DecodeLibrary(Reader& r, LibraryStepSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    switch (field) {
      case 1:
        return ReadString(r, wire_type, field, &out->op);
      case 2:
        return AppendMessage(r, wire_type, field, &out->args, "args", DecodeArgument);
      case 3:
        return In(ReadRepeated(r, wire_type, field, &out->outputs), "outputs");
      case 4:
        return ReadString(r, wire_type, field, &out->schema);
      default:
        return r.Skip(field, wire_type);
    }
  });
}

Status DecodeInputUpdate(Reader& r, InputUpdateSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    std::optional<Reader> nested;
    switch (field) {
      case 1:
        return ReadScalar(r, wire_type, field, &out->input);
      case 2:
        return ReadScalar(r, wire_type, field, &out->value);
      case 3:
        KILN_RETURN_IF_ERROR(OpenMessage(r, wire_type, field, &nested));
        if (!nested) return Status::OK();
        out->has_new_meta = true;
        return In(DecodeMeta(*nested, &out->new_meta), "new_meta");
      default:
        return r.Skip(field, wire_type);
    }
  });
}

Status DecodeStep(Reader& r, StepSpec* out) {
  // `kind` is a oneof: the last of kernel and library wins, and the same one again merges.
  enum { kNeither, kKernel, kLibrary } which = kNeither;
  KernelStepSpec kernel;
  LibraryStepSpec library;
  std::vector<uint32_t> release;
  const size_t start = r.offset();
  KILN_RETURN_IF_ERROR(ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    std::optional<Reader> nested;
    switch (field) {
      case 1:
        KILN_RETURN_IF_ERROR(OpenMessage(r, wire_type, field, &nested));
        if (!nested) return Status::OK();
        if (which != kKernel) kernel = KernelStepSpec{}, which = kKernel;
        return In(DecodeKernel(*nested, &kernel), "kernel");
      case 2:
        KILN_RETURN_IF_ERROR(OpenMessage(r, wire_type, field, &nested));
        if (!nested) return Status::OK();
        if (which != kLibrary) library = LibraryStepSpec{}, which = kLibrary;
        return In(DecodeLibrary(*nested, &library), "library");
      case 3:
        return In(ReadRepeated(r, wire_type, field, &release), "release");
      default:
        return r.Skip(field, wire_type);
    }
  }));
  if (which == kKernel) {
    kernel.release = std::move(release);
    *out = std::move(kernel);
  } else if (which == kLibrary) {
    library.release = std::move(release);
    *out = std::move(library);
  } else {
    return At(start, "the step names neither a kernel nor a library call");
  }
  return Status::OK();
}

Status DecodeBuffer(Reader& r, BufferSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) {
    switch (field) {
      case 1:
        return ReadScalar(r, wire_type, field, &out->id);
      case 2:
        return ReadScalar(r, wire_type, field, &out->in_arena);
      case 3:
        return ReadScalar(r, wire_type, field, &out->arena_offset);
      default:
        return r.Skip(field, wire_type);
    }
  });
}

Status DecodeExecutionPlan(Reader& r, PlanSpec* out) {
  return ForEachField(r, [&](uint32_t field, int wire_type) -> Status {
    switch (field) {
      case 1:
        return In(ReadRepeated(r, wire_type, field, &out->inputs), "inputs");
      case 3:
        return AppendMessage(r, wire_type, field, &out->constants, "constants", DecodeConstant);
      case 4:
        return AppendMessage(r, wire_type, field, &out->steps, "steps", DecodeStep);
      case 5:
        return In(ReadRepeated(r, wire_type, field, &out->outputs), "outputs");
      case 6:
        return AppendMessage(r, wire_type, field, &out->values, "values", DecodeValue);
      case 7:
        return AppendMessage(r, wire_type, field, &out->buffers, "buffers", DecodeBuffer);
      case 8:
        return ReadScalar(r, wire_type, field, &out->arena_bytes);
      case 9:
        return AppendMessage(r, wire_type, field, &out->prologue, "prologue", DecodeStep);
      case 10:
        return In(ReadRepeated(r, wire_type, field, &out->prologue_outputs), "prologue_outputs");
      case 11:
        return AppendMessage(r, wire_type, field, &out->input_updates, "input_updates",
                             DecodeInputUpdate);
      case 12:
        return AppendMessage(r, wire_type, field, &out->size_symbols, "size_symbols",
                             DecodeSizeSymbol);
      default:
        return r.Skip(field, wire_type);
    }
  });
}

}  // namespace

StatusOr<PlanSpec> DecodePlan(std::string_view bytes) {
  PlanSpec spec;
  Reader reader(bytes, bytes.data());
  Status status = DecodeExecutionPlan(reader, &spec);
  if (!status.ok()) {
    const bool leaf = status.message()[0] == ':';  // An error outside any field.
    return status.Prefixed(leaf ? "kiln plan: the ExecutionPlan does not decode"
                                : "kiln plan: the ExecutionPlan does not decode: ");
  }
  return spec;
}

}  // namespace kiln::runtime
