#pragma once
// The common base of everything a plugin creates.

namespace trainyard {

// Each interface (Dataset, Model, ...) derives from Component and names its kind in `kKind`, the
// key the registry and the recipe use. The destructor is defined in the SDK library so that type
// information and vtables of the interfaces live there, not in whichever plugin came first.
class Component {
 public:
  virtual ~Component();
};

}  // namespace trainyard
