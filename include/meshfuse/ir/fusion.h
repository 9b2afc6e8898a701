// Fusion: owns the Vals, Exprs, IterDomains and meshes of one single-device tensor program.
// Nodes are created only through a Fusion (no global "current fusion").
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshfuse/ir/device_mesh.h"
#include "meshfuse/ir/expr.h"
#include "meshfuse/ir/val.h"

namespace meshfuse {

class Fusion {
 public:
  Fusion() = default;
  Fusion(const Fusion&) = delete;
  Fusion& operator=(const Fusion&) = delete;
  ~Fusion();

  // A structural copy: every value, op, IterDomain (with its transforms and parallelization),
  // mesh, schedule, pin, provenance, alias and extent constraint, in the same order, so the copy
  // prints identically and display names agree. (src/ir/fusion_clone.cpp)
  std::unique_ptr<Fusion> clone() const;

  // A fusion input of `shape` (-1 or Extent::symbolic: a size bound at run time; a size of 1
  // is a broadcast dim). Throws NameError on a duplicate name, ShapeError on a bad extent.
  TensorView* defineTensor(const std::vector<Extent>& shape, DataType dtype, std::string name = "");
  Scalar* scalar(double value, DataType dtype = DataType::Float);

  // Appends an op: checks operands and attributes against the kind's schema (missing
  // attributes get their defaults), infers the output's shape and dtype, and returns it.
  // Throws a typed UserError that names the op and tensors on bad input.
  TensorView* apply(OpKind kind, std::vector<Val*> inputs, Attributes attrs = {}, std::string out_name = "");
  void addOutput(TensorView* tv);
  // In-place update: fusion output `output` is written into the buffer of fusion input `input`
  // (an optimizer step updating a parameter and its state), by index, so passes that replace an
  // output keep it. Both must have the same dtype and shape (checked here: DtypeError,
  // ShapeError) and, once propagated, the same mesh and placements (the verifier: PlacementError).
  // compile() checks that the program may write it in place (lower/check_aliases.h); the runtime
  // then allocates nothing for the output and returns the input's buffer, updated.
  void aliasOutputToInput(int64_t output, int64_t input);
  const std::map<int64_t, int64_t>& outputAliases() const { return output_aliases_; }  // output -> input
  // The input whose buffer output tensor `out` is written into, or nullptr.
  const TensorView* aliasedInput(const TensorView* out) const;
  // Unlinks `e` from the program (its output must be unused and not a fusion output).
  void removeExpr(Expr* e);

  // ---- mutation, for passes ----------------------------------------------------------
  // While set, apply() inserts new Exprs just before `e` instead of appending.
  void setInsertionPoint(Expr* e) { insertion_point_ = e; }
  Expr* insertionPoint() const { return insertion_point_; }
  // Makes `e` read `replacement` wherever it read `old`.
  void replaceOperand(Expr* e, Val* old, Val* replacement);
  // Makes operand slot `index` of `e` read `replacement` (other slots reading the same value
  // keep it: mul(%q, %q) may need %q in two different shardings).
  void replaceOperandAt(Expr* e, size_t index, Val* replacement);
  // Makes the fusion output `old` be `replacement` instead.
  void replaceOutput(TensorView* old, TensorView* replacement);
  // Makes every reader of `old` (and the output list) read `replacement` instead.
  void replaceAllUses(TensorView* old, TensorView* replacement);
  // Sets attribute `name` of `e` (checked against the op's schema; its output type stays).
  void setAttribute(Expr* e, const std::string& name, AttrValue value);
  // Gives `v` the user name `name` (NameError when taken); "" makes it positional again.
  void rename(Val* v, std::string name);

  const std::vector<TensorView*>& inputs() const { return inputs_; }
  const std::vector<TensorView*>& outputs() const { return outputs_; }
  // Program order (a topological order).
  const std::vector<Expr*>& exprs() const { return exprs_; }
  // Inputs, then every Expr's outputs in program order.
  std::vector<TensorView*> tensorViews() const;
  bool isInput(const Val* v) const;
  bool isOutput(const Val* v) const;

  // Meshes are interned by value; returns the index of `mesh` in the table. A name makes it
  // printable as @name (otherwise @m<index>).
  int64_t addMesh(const DeviceMesh& mesh, std::string name = "");
  const DeviceMesh& mesh(int64_t index) const { return *meshes_.at(index).mesh; }
  int64_t numMeshes() const { return static_cast<int64_t>(meshes_.size()); }
  // The world size the meshes need: their largest device id + 1 (0 without meshes).
  int64_t worldSizeNeeded() const;
  std::string meshName(int64_t index) const;

  IterDomain* newIterDomain(Extent extent, IterType type);
  IdTransform* newTransform(IdTransform t);

  // The name the printer and error messages use: the user's name, or %N where N numbers the
  // unnamed TensorViews in program order (deterministic, independent of creation counters).
  std::string displayName(const Val* v) const;

  // Two extents an op requires equal that are only known at run time (?s0 vs ?s1, or ?s0 vs
  // 8): found by shape inference, recorded by apply(), checked by checkExtentConstraints once
  // sizes are bound.
  struct ExtentConstraint {
    Extent a, b;
    std::string op, what;             // "add", "dim 0"
    const Val *ta, *tb;               // the operands that have them
    const TensorView* out = nullptr;  // the op's output (names the op in messages)
  };
  // Throws ShapeError naming the op (by its output and operands), both tensors and both values
  // on a violated constraint.
  void checkExtentConstraints(const SymbolBindings& bindings) const;
  // Looks a TensorView up by display name; nullptr when absent.
  TensorView* findTensor(std::string_view display_name) const;

  // Whether decompose-reshardings takes each value to a sharding it needs by the order of
  // one-axis steps that sends the fewest bytes, rather than the one of fewest collectives (the
  // default: resharding_steps.h). The plan search sets it where such a plan sends fewer bytes in
  // no more collectives overall. The text form prints it as `reshard by bytes`.
  bool reshardByBytes() const { return reshard_by_bytes_; }
  void setReshardByBytes(bool by_bytes) { reshard_by_bytes_ = by_bytes; }

 private:
  // tests/unit/verifier_test.cpp: builds IR that no API can (a value defined twice, an input with
  // a definition) to test that the verifier catches it.
  friend struct FusionTestAccess;
  struct MeshEntry {
    std::unique_ptr<DeviceMesh> mesh;
    std::string name;
  };
  std::vector<std::unique_ptr<Val>> vals_;
  std::vector<std::unique_ptr<Expr>> expr_storage_;
  std::vector<std::unique_ptr<IterDomain>> ids_;
  std::vector<std::unique_ptr<IdTransform>> transforms_;
  std::vector<MeshEntry> meshes_;
  std::vector<TensorView*> inputs_;
  std::vector<TensorView*> outputs_;
  std::vector<Expr*> exprs_;
  Expr* insertion_point_ = nullptr;
  std::vector<ExtentConstraint> extent_constraints_;
  std::map<int64_t, int64_t> output_aliases_;
  bool reshard_by_bytes_ = false;
};

}  // namespace meshfuse
