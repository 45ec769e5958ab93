// safetensors reader and writer: round trips of every dtype, the reference
// writer's exact bytes, and every malformed-file rule with its error.
#include "refit/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/checkpoint_test_util.h"

namespace refit {
namespace {

namespace fs = std::filesystem;
using namespace std::string_view_literals;
using testing::Bytes;

using testing::content_of;
using testing::TempDir;

// Copies without memcpy: an empty view and an empty Bytes may both have a
// null data(), and memcpy/memcmp on a null pointer is undefined even for
// 0 bytes (UBSan reports it).
Bytes from_string(std::string_view s) {
  const auto* first = reinterpret_cast<const std::byte*>(s.data());
  return Bytes(first, first + s.size());
}

// Byte equality, defined for empty ranges (see from_string).
bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) { return std::ranges::equal(a, b); }

// A raw file: 8-byte length of `header`, `header`, then `data_bytes` bytes.
Bytes raw_file(std::string_view header, std::size_t data_bytes, std::uint64_t length_override = UINT64_MAX) {
  const std::uint64_t n = length_override == UINT64_MAX ? header.size() : length_override;
  Bytes b(8);
  std::memcpy(b.data(), &n, 8);
  Bytes h = from_string(header);
  b.insert(b.end(), h.begin(), h.end());
  b.resize(b.size() + data_bytes, std::byte{0x5a});
  return b;
}

void write_bytes(const std::string& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

Status parse(const Bytes& file) { return parse_safetensors(file, "bad.safetensors").status(); }

// Checks code and that the message names the file and holds every needle.
void expect_refused(const Bytes& file, StatusCode code, const std::vector<std::string>& needles) {
  const Status s = parse(file);
  ASSERT_FALSE(s.ok()) << "accepted a malformed file";
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find("safetensors file 'bad.safetensors'"), std::string::npos) << s.ToString();
  for (const std::string& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << "missing '" << n << "' in " << s.ToString();
}

// ---- dtypes -----------------------------------------------------------------

// Catches: a swapped or missing entry in the name table (e.g. F8_E4M3 mapped
// to e5m2, BF16 to float16), or a refit dtype without a safetensors name.
TEST(SafetensorsDType, NamesOfTheFormatMapOntoRefitDTypes) {
  const std::vector<std::pair<std::string, DType>> spec = {
      {"BOOL", DType::kBool},       {"U8", DType::kUInt8},        {"I8", DType::kInt8},
      {"I16", DType::kInt16},       {"I32", DType::kInt32},       {"I64", DType::kInt64},
      {"F16", DType::kFloat16},     {"BF16", DType::kBFloat16},   {"F32", DType::kFloat32},
      {"F64", DType::kFloat64},     {"F8_E4M3", DType::kFloat8E4M3FN}, {"F8_E5M2", DType::kFloat8E5M2}};
  ASSERT_EQ(spec.size(), static_cast<std::size_t>(kDTypeCount));
  for (const auto& [name, dtype] : spec) {
    StatusOr<DType> d = dtype_from_safetensors(name);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(*d, dtype) << name;
    EXPECT_EQ(safetensors_dtype_name(dtype), name);
  }
}

// Catches: silently mapping U16/U32/U64 onto a signed type of the same size
// (the bytes would load, the values would be wrong), or a vague message.
TEST(SafetensorsDType, DTypesRefitLacksAreRefusedByName) {
  for (const char* name : {"U16", "U32", "U64", "F8_E8M0", "C64"}) {
    StatusOr<DType> d = dtype_from_safetensors(name);
    ASSERT_FALSE(d.ok()) << name;
    EXPECT_NE(d.status().message().find(std::string("'") + name + "' is not supported by refit"), std::string::npos)
        << d.status().ToString();
  }
  StatusOr<DType> unknown = dtype_from_safetensors("bfloat16");  // torch's name is not the format's
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown dtype 'bfloat16'"), std::string::npos);
}

// ---- round trips ------------------------------------------------------------

// Catches: a writer that drops or reorders bytes, writes a wrong dtype name or
// shape, or a reader returning another tensor's span; misaligned data (the
// writer must place every tensor at a multiple of its element size).
TEST(SafetensorsRoundTrip, EveryDTypeThroughAFile) {
  TempDir dir;
  std::vector<TensorSpec> specs;
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto d = static_cast<DType>(i);
    specs.push_back(TensorSpec{"t." + std::string(dtype_name(d)), d, {3, 1 + i}});
  }
  specs.push_back(TensorSpec{"odd.bf16", DType::kBFloat16, {1, 3}});  // 6 bytes: would misalign what follows
  specs.push_back(TensorSpec{"odd.f64", DType::kFloat64, {5}});
  std::vector<Bytes> data;
  std::vector<SafetensorsWriteTensor> tensors;
  for (const TensorSpec& s : specs) data.push_back(content_of(s));
  for (std::size_t i = 0; i < specs.size(); ++i) tensors.push_back({specs[i], data[i]});
  const std::string path = dir.file("all.safetensors");
  ASSERT_TRUE(write_safetensors(path, tensors).ok());

  StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->tensors().size(), specs.size());
  EXPECT_EQ(file->header().data_offset % 8, 0u);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const SafetensorsTensor* t = file->find(specs[i].name);
    ASSERT_NE(t, nullptr) << specs[i].name;
    EXPECT_EQ(t->spec, specs[i]);
    std::span<const std::byte> got = file->data(*t);
    ASSERT_EQ(got.size(), data[i].size());
    EXPECT_TRUE(same_bytes(got, data[i])) << specs[i].name;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(got.data()) % dtype_size(specs[i].dtype), 0u)
        << specs[i].name << " is not aligned to its element size";
  }
  EXPECT_EQ(file->find("absent"), nullptr);
}

// Catches: treating shape [] as 0 bytes (a scalar has one element), refusing
// empty tensors (the spec allows them), or a 0-byte tensor taking bytes.
TEST(SafetensorsRoundTrip, ScalarsAndEmptyTensors) {
  const std::vector<TensorSpec> specs = {{"scalar.f32", DType::kFloat32, {}},
                                         {"scalar.i64", DType::kInt64, {}},
                                         {"empty.1d", DType::kBFloat16, {0}},
                                         {"empty.3d", DType::kFloat32, {4, 0, 3}},
                                         {"flag", DType::kBool, {}}};
  std::vector<Bytes> data;
  std::vector<SafetensorsWriteTensor> tensors;
  for (const TensorSpec& s : specs) data.push_back(content_of(s));
  for (std::size_t i = 0; i < specs.size(); ++i) tensors.push_back({specs[i], data[i]});
  StatusOr<Bytes> bytes = encode_safetensors(tensors);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  StatusOr<SafetensorsHeader> h = parse_safetensors(*bytes, "mem");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->data_bytes, 4u + 8u + 1u);
  ASSERT_EQ(h->tensors.size(), specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    auto it = std::find_if(h->tensors.begin(), h->tensors.end(),
                           [&](const SafetensorsTensor& t) { return t.spec.name == specs[i].name; });
    ASSERT_NE(it, h->tensors.end());
    EXPECT_EQ(it->spec, specs[i]);
    EXPECT_EQ(it->end - it->begin, specs[i].nbytes());
    EXPECT_TRUE(same_bytes(std::span<const std::byte>(*bytes).subspan(h->data_offset + it->begin, data[i].size()), data[i]));
  }
}

// Catches: metadata dropped by the writer or the reader, or written when
// there is none (the reference writes no __metadata__ key then).
TEST(SafetensorsRoundTrip, Metadata) {
  const TensorSpec spec{"w", DType::kFloat16, {2}};
  const Bytes data = content_of(spec);
  const std::vector<SafetensorsWriteTensor> tensors = {{spec, data}};
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "caf\xc3\xa9 \"quoted\""}};
  StatusOr<Bytes> with = encode_safetensors(tensors, meta);
  ASSERT_TRUE(with.ok());
  StatusOr<SafetensorsHeader> h = parse_safetensors(*with, "mem");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->metadata, meta);

  StatusOr<Bytes> without = encode_safetensors(tensors);
  ASSERT_TRUE(without.ok());
  const std::string text(reinterpret_cast<const char*>(without->data()) + 8, 40);
  EXPECT_EQ(text.find("__metadata__"), std::string::npos);
  EXPECT_TRUE(parse_safetensors(*without, "mem")->metadata.empty());
}

// The reference writer's output for its own unit tests (huggingface/
// safetensors, tensor.rs: test_serialization, test_empty): the same inputs
// must give the same bytes. Catches: a pretty-printed or reordered header,
// padding computed on the wrong length, metadata written after the tensors.
TEST(SafetensorsWriter, SameBytesAsTheReferenceWriter) {
  const TensorSpec spec{"attn.0", DType::kFloat32, {1, 2, 3}};
  const float values[] = {0, 1, 2, 3, 4, 5};
  Bytes data(sizeof values);
  std::memcpy(data.data(), values, sizeof values);
  StatusOr<Bytes> out = encode_safetensors(std::vector<SafetensorsWriteTensor>{{spec, data}});
  ASSERT_TRUE(out.ok());
  const Bytes expected_prefix = raw_file("{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}", 0);
  ASSERT_EQ(expected_prefix.size(), 8u + 64u);
  Bytes expected = expected_prefix;
  expected.insert(expected.end(), data.begin(), data.end());
  EXPECT_EQ(*out, expected);

  StatusOr<Bytes> empty = encode_safetensors({});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, raw_file("{}      ", 0));
  StatusOr<Bytes> meta = encode_safetensors({}, {{"framework", "pt"}});
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(*meta, raw_file("{\"__metadata__\":{\"framework\":\"pt\"}}     ", 0));
}

// Catches: data laid out in name order or by enum (misaligning wider types
// after odd-sized narrow ones), or an unstable order among equal sizes.
TEST(SafetensorsWriter, DataOrderIsWidestFirstThenTheCallersOrder) {
  const std::vector<TensorSpec> specs = {{"z.u8", DType::kUInt8, {3}},   {"y.f32", DType::kFloat32, {2}},
                                         {"x.bf16", DType::kBFloat16, {3}}, {"a.f32", DType::kFloat32, {1}},
                                         {"b.i64", DType::kInt64, {1}}};
  std::vector<Bytes> data;
  std::vector<SafetensorsWriteTensor> tensors;
  for (const TensorSpec& s : specs) data.push_back(content_of(s));
  for (std::size_t i = 0; i < specs.size(); ++i) tensors.push_back({specs[i], data[i]});
  StatusOr<Bytes> out = encode_safetensors(tensors);
  ASSERT_TRUE(out.ok());
  StatusOr<SafetensorsHeader> h = parse_safetensors(*out, "mem");
  ASSERT_TRUE(h.ok());
  std::vector<std::string> order;
  for (const SafetensorsTensor& t : h->tensors) order.push_back(t.spec.name);
  EXPECT_EQ(order, (std::vector<std::string>{"b.i64", "y.f32", "a.f32", "x.bf16", "z.u8"}));
}

// Catches: a writer that accepts what the reader would refuse (or what would
// make an ambiguous file).
TEST(SafetensorsWriter, RefusesBadInput) {
  const TensorSpec a{"a", DType::kFloat32, {2}};
  const Bytes good = content_of(a);
  const Bytes short_data(4);
  auto message = [](std::vector<SafetensorsWriteTensor> t) {
    StatusOr<Bytes> out = encode_safetensors(t);
    return out.ok() ? std::string("accepted") : out.status().message();
  };
  EXPECT_NE(message({{a, good}, {a, good}}).find("tensor 'a' appears twice"), std::string::npos);
  EXPECT_NE(message({{a, short_data}}).find("needs 8 bytes, but its data holds 4"), std::string::npos);
  EXPECT_NE(message({{TensorSpec{"__metadata__", DType::kUInt8, {0}}, {}}}).find("__metadata__"), std::string::npos);
  EXPECT_NE(message({{TensorSpec{"", DType::kUInt8, {0}}, {}}}).find("empty name"), std::string::npos);
  EXPECT_NE(message({{TensorSpec{"bad\xff", DType::kUInt8, {0}}, {}}}).find("not valid UTF-8"), std::string::npos);
}

// Catches: writing in place (a reader could see a partial file), leaving the
// temporary file behind, or not reporting a failed write.
TEST(SafetensorsWriter, ReplacesTheFileAtomicallyAndCleansUp) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const TensorSpec a{"a", DType::kFloat32, {2}};
  const Bytes v1 = content_of(a, 1), v2 = content_of(a, 2);
  ASSERT_TRUE(write_safetensors(path, std::vector<SafetensorsWriteTensor>{{a, v1}}).ok());
  StatusOr<SafetensorsFile> old_file = SafetensorsFile::Open(path);
  ASSERT_TRUE(old_file.ok());
  ASSERT_TRUE(write_safetensors(path, std::vector<SafetensorsWriteTensor>{{a, v2}}).ok());
  // The old mapping still shows the old bytes (rename, not rewrite in place).
  EXPECT_EQ(std::memcmp(old_file->data(old_file->tensors()[0]).data(), v1.data(), v1.size()), 0);
  StatusOr<SafetensorsFile> new_file = SafetensorsFile::Open(path);
  ASSERT_TRUE(new_file.ok());
  EXPECT_EQ(std::memcmp(new_file->data(new_file->tensors()[0]).data(), v2.data(), v2.size()), 0);
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir.path())) entries.push_back(e.path().filename().string());
  EXPECT_EQ(entries, std::vector<std::string>{"m.safetensors"});

  const Status s = write_safetensors(dir.file("no/such/dir/m.safetensors"), std::vector<SafetensorsWriteTensor>{{a, v1}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/dir/m.safetensors.tmp."), std::string::npos) << s.ToString();
}

// ---- the mapped file --------------------------------------------------------

// Catches: a missing file reported without its path or with another code; a
// directory mapped as a file; a moved-from object unmapping the mapping the
// new owner uses (use after unmap, caught by ASan or as wrong bytes).
TEST(SafetensorsFileTest, OpenErrorsAndMoves) {
  TempDir dir;
  StatusOr<SafetensorsFile> missing = SafetensorsFile::Open(dir.file("nope.safetensors"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.safetensors"), std::string::npos);
  StatusOr<SafetensorsFile> directory = SafetensorsFile::Open(dir.path());
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos);
  write_bytes(dir.file("empty"), {});
  StatusOr<SafetensorsFile> empty = SafetensorsFile::Open(dir.file("empty"));
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kDataLoss);

  const TensorSpec a{"a", DType::kInt32, {4}};
  const Bytes v = content_of(a);
  ASSERT_TRUE(write_safetensors(dir.file("a.safetensors"), std::vector<SafetensorsWriteTensor>{{a, v}}).ok());
  StatusOr<SafetensorsFile> opened = SafetensorsFile::Open(dir.file("a.safetensors"));
  ASSERT_TRUE(opened.ok());
  SafetensorsFile first = std::move(opened).value();
  SafetensorsFile second = std::move(first);
  SafetensorsFile third = SafetensorsFile::Open(dir.file("a.safetensors")).value();
  third = std::move(second);
  ASSERT_NE(third.find("a"), nullptr);
  EXPECT_EQ(std::memcmp(third.data(*third.find("a")).data(), v.data(), v.size()), 0);
}

// ---- accepted variations ----------------------------------------------------

// Catches: a reader that insists on the reference writer's own habits
// (header keys in data order, no whitespace), or that refuses 0-byte tensors
// sharing an offset, or a file with no tensors at all.
TEST(SafetensorsReader, AcceptsWhatTheSpecAllows) {
  // Keys out of data order, pretty-printed, padded; empty tensors at offsets 0 and 4.
  const std::string header = R"({
    "b": {"shape": [2], "dtype": "I16", "data_offsets": [4, 8]},
    "e2": {"dtype": "F32", "shape": [0, 7], "data_offsets": [4, 4]},
    "a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
    "e1": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
    "z": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]},
    "__metadata__": {}
  }   )";
  StatusOr<SafetensorsHeader> h = parse_safetensors(raw_file(header, 8), "ok.safetensors");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  std::vector<std::string> order;
  for (const SafetensorsTensor& t : h->tensors) order.push_back(t.spec.name);
  EXPECT_EQ(order, (std::vector<std::string>{"z", "a", "e1", "e2", "b"}));  // storage order

  StatusOr<SafetensorsHeader> none = parse_safetensors(raw_file("{}", 0), "none.safetensors");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->tensors.empty());
}

// ---- every malformed-file rule ----------------------------------------------
// Each case catches the removal of the one check it names (the file would be
// accepted, or refused by a later check with a message that does not name
// the rule).

const char* const kGood = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST(SafetensorsMalformed, ShortFileAndHeaderLength) {
  expect_refused(Bytes(5), StatusCode::kDataLoss, {"5 bytes, too short for the 8-byte header length"});
  expect_refused(raw_file(kGood, 8, 100'000'001), StatusCode::kInvalidArgument,
                 {"header length 100000001 exceeds the format's limit of 100000000 bytes"});
  expect_refused(raw_file(kGood, 8, UINT64_MAX - 3), StatusCode::kInvalidArgument, {"exceeds the format's limit"});
  const std::size_t n = std::strlen(kGood);
  expect_refused(raw_file(kGood, 0, n + 1), StatusCode::kDataLoss,
                 {"header length " + std::to_string(n + 1) + " runs past the end of the file", "truncated"});
  ASSERT_TRUE(parse(raw_file(kGood, 8)).ok());  // the base case is fine
}

TEST(SafetensorsMalformed, HeaderIsNotAJsonObject) {
  expect_refused(raw_file("", 0), StatusCode::kInvalidArgument, {"beginning with '{'", "it is empty"});
  expect_refused(raw_file("[1, 2]", 0), StatusCode::kInvalidArgument, {"beginning with '{'", "'[' (0x5b)"});
  expect_refused(raw_file(" {}", 0), StatusCode::kInvalidArgument, {"beginning with '{'", "(0x20)"});
  expect_refused(raw_file("{\"w\": ", 0), StatusCode::kInvalidArgument, {"header: not valid JSON"});
  expect_refused(raw_file("{} {}", 0), StatusCode::kInvalidArgument, {"not valid JSON"});
  // nlohmann alone would stop at the NUL and accept this header.
  expect_refused(raw_file("{}\0\0\0\0\0\0"sv, 0), StatusCode::kInvalidArgument, {"not valid JSON: NUL byte at offset 2"});
  expect_refused(raw_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}\0junk"sv, 0),
                 StatusCode::kInvalidArgument, {"NUL byte"});
  expect_refused(raw_file("{\"w\xff\": 1}", 0), StatusCode::kInvalidArgument, {"not valid JSON"});  // not UTF-8
  expect_refused(raw_file(std::string(40, '{'), 0), StatusCode::kInvalidArgument, {"not valid JSON"});
  std::string deep = "{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}";
  expect_refused(raw_file(deep, 0), StatusCode::kInvalidArgument, {"nested deeper than 32 levels"});
}

TEST(SafetensorsMalformed, EntryFields) {
  expect_refused(raw_file(R"({"w":[1]})", 0), StatusCode::kInvalidArgument, {"tensor 'w': entry must be an object"});
  expect_refused(raw_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8), StatusCode::kInvalidArgument,
                 {"tensor 'w': missing field 'dtype'"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8), StatusCode::kInvalidArgument,
                 {"tensor 'w': missing field 'shape'"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2]}})", 8), StatusCode::kInvalidArgument,
                 {"tensor 'w': missing field 'data_offsets'"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': unknown field 'offsets'"});
  expect_refused(raw_file(R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"a tensor has an empty name"});
}

TEST(SafetensorsMalformed, DType) {
  expect_refused(raw_file(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8), StatusCode::kInvalidArgument,
                 {"tensor 'w': dtype must be a string, but it is an integer (4)"});
  expect_refused(raw_file(R"({"w":{"dtype":"float32","shape":[2],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': unknown dtype 'float32'"});
  expect_refused(raw_file(R"({"w":{"dtype":"U16","shape":[4],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': dtype 'U16' is not supported by refit"});
}

TEST(SafetensorsMalformed, Shape) {
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': shape must be an array, but it is an integer (2)"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': shape[0] must be a non-negative integer", "a negative integer (-2)"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[1,2.0],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': shape[1]", "a non-integer number (2.0)"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': shape[0]", "a string"});
  expect_refused(raw_file(R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': shape[0] must be a non-negative integer below 2^63"});
  // Product overflows 64 bits: must not wrap around to the range's size.
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4,2],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': F32 shape [4611686018427387904, 4, 2] has more bytes than fit in 64 bits"});
  // Fits 64 bits but not refit's 63 (validate_spec).
  expect_refused(raw_file(R"({"w":{"dtype":"U8","shape":[4611686018427387904,3],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w'"});
}

TEST(SafetensorsMalformed, Offsets) {
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': data_offsets must be [BEGIN, END]", "[0,8,9]"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-1,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': data_offsets must be [BEGIN, END]"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":{"a":1}}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': data_offsets must be [BEGIN, END]"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': data_offsets [8, 0] end before they begin"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 7), StatusCode::kDataLoss,
                 {"tensor 'w': data_offsets [0, 8) run past the end of the data section (7 bytes)"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", 12),
                 StatusCode::kInvalidArgument, {"tensor 'w': F32 shape [2] needs 8 bytes, but data_offsets [0, 12) hold 12"});
  expect_refused(raw_file(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensor 'w': BF16 shape [2, 3] needs 12 bytes"});
}

TEST(SafetensorsMalformed, OverlapsHolesAndTrailingBytes) {
  expect_refused(raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                              "b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
                 StatusCode::kInvalidArgument, {"tensors 'a' [0, 16) and 'b' [8, 16) overlap"});
  // The same range twice (an alias): an overlap too.
  expect_refused(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                              "b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"tensors 'a' [0, 8) and 'b' [0, 8) overlap"});
  // An empty tensor inside another one's range.
  expect_refused(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                              "e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})", 8),
                 StatusCode::kInvalidArgument, {"'a' [0, 8) and 'e' [4, 4) overlap"});
  expect_refused(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                              "b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
                 StatusCode::kInvalidArgument, {"bytes [8, 12) of the data section belong to no tensor", "before tensor 'b'"});
  expect_refused(raw_file(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                 StatusCode::kInvalidArgument, {"bytes [0, 4) of the data section belong to no tensor"});
  expect_refused(raw_file(kGood, 9), StatusCode::kInvalidArgument,
                 {"bytes [8, 9) at the end of the data section belong to no tensor", "trailing"});
  expect_refused(raw_file("{}", 1), StatusCode::kInvalidArgument, {"bytes [0, 1) at the end"});
}

TEST(SafetensorsMalformed, DuplicateKeys) {
  expect_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                              "w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
                 StatusCode::kInvalidArgument, {"duplicate key \"w\" at the top level"});
  expect_refused(raw_file(R"({"w":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8),
                 StatusCode::kInvalidArgument, {"duplicate key \"dtype\" inside \"w\""});
  expect_refused(raw_file(R"({"__metadata__":{"a":"1","a":"2"}})", 0), StatusCode::kInvalidArgument,
                 {"duplicate key \"a\" inside \"__metadata__\""});
  expect_refused(raw_file(R"({"__metadata__":{},"__metadata__":{}})", 0), StatusCode::kInvalidArgument,
                 {"duplicate key \"__metadata__\""});
}

TEST(SafetensorsMalformed, Metadata) {
  expect_refused(raw_file(R"({"__metadata__":["a"]})", 0), StatusCode::kInvalidArgument,
                 {"__metadata__ must be an object of string -> string, but it is an array"});
  expect_refused(raw_file(R"({"__metadata__":{"total":3}})", 0), StatusCode::kInvalidArgument,
                 {"__metadata__ key 'total' must map to a string, but it maps to an integer (3)"});
  expect_refused(raw_file(R"({"__metadata__":{"n":null}})", 0), StatusCode::kInvalidArgument,
                 {"__metadata__ key 'n' must map to a string, but it maps to null"});
}

// A header of 40,000 tensors parses in about the time of 8 headers of 5,000
// (linear), not 64 (quadratic). Catches: a quadratic parse (nlohmann's
// parser-callback DOM rescans the parent object after every child: 40,000
// tensors took ~15 s that way, 0.4 s now). A ratio of two parses in the same
// run, best of 3 each, so a busy machine or a sanitizer build (which slow
// both alike) does not fail it; the bound (20x) sits far from both 8 and 64.
double best_parse_seconds(int tensors) {
  std::vector<SafetensorsWriteTensor> list;
  const Bytes zeros(2);
  for (int i = 0; i < tensors; ++i) {
    list.push_back({TensorSpec{"model.layers." + std::to_string(i / 400) + ".mlp.experts." + std::to_string(i % 400) +
                                   ".down_proj.weight",
                               DType::kBFloat16, {1}},
                    zeros});
  }
  const Bytes file = encode_safetensors(list).value();
  double best = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    StatusOr<SafetensorsHeader> h = parse_safetensors(file, "large");
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    EXPECT_TRUE(h.ok() && h->tensors.size() == static_cast<std::size_t>(tensors));
  }
  return best;
}

TEST(SafetensorsReader, LargeHeaderParsesInLinearTime) {
  const double small = best_parse_seconds(5000);
  const double large = best_parse_seconds(40000);
  EXPECT_LT(large, 20 * small) << "5,000 tensors: " << small << " s, 40,000 tensors: " << large << " s";
}

// A deterministic mini-fuzz (the libFuzzer target does this at scale): every
// single-byte change and every truncation of a valid file either parses to a
// self-consistent header or is refused; never a crash or an out-of-range
// span. Catches: a missing bounds check that ASan/UBSan builds would flag,
// or an accepted header whose ranges leave the data section.
TEST(SafetensorsReader, MutatedFilesAreRefusedOrConsistent) {
  std::vector<TensorSpec> specs = {{"a", DType::kBFloat16, {2, 3}}, {"b", DType::kFloat32, {}}, {"c", DType::kUInt8, {0}}};
  std::vector<Bytes> data;
  std::vector<SafetensorsWriteTensor> tensors;
  for (const TensorSpec& s : specs) data.push_back(content_of(s));
  for (std::size_t i = 0; i < specs.size(); ++i) tensors.push_back({specs[i], data[i]});
  const Bytes good = encode_safetensors(tensors, {{"k", "v"}}).value();
  std::mt19937_64 rng(42);
  int accepted = 0, refused = 0;
  auto check = [&](const Bytes& file) {
    StatusOr<SafetensorsHeader> h = parse_safetensors(file, "m");
    if (!h.ok()) {
      ++refused;
      return;
    }
    ++accepted;
    std::uint64_t covered = 0;
    for (const SafetensorsTensor& t : h->tensors) {
      ASSERT_EQ(t.begin, covered);
      ASSERT_EQ(t.end - t.begin, t.spec.nbytes());
      covered = t.end;
    }
    ASSERT_EQ(covered, h->data_bytes);
    ASSERT_EQ(h->data_offset + h->data_bytes, file.size());
  };
  for (std::size_t i = 0; i < good.size(); ++i) {
    Bytes m = good;
    m[i] ^= static_cast<std::byte>(1 + rng() % 255);
    check(m);
    check(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(i)));
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(accepted, 0);  // data bytes may change freely
}

}  // namespace
}  // namespace refit
