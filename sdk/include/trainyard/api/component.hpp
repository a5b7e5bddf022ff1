#pragma once
// The common base of everything a plugin creates, and the library handle that travels with every
// object a plugin hands out.

#include <memory>
#include <type_traits>
#include <utility>

namespace trainyard {

class Registry;

// Each interface (Dataset, Model, ...) derives from Component and names its kind in `kKind`, the
// key the registry and the recipe use. The destructor is defined in the SDK library so that type
// information and vtables of the interfaces live there, not in whichever plugin came first.
class Component {
 public:
  virtual ~Component();
  // The library holding this component's code; empty for a component built into the host or a
  // test. Objects the component hands out hold it (keep_library_loaded), as OpenVINO's SoPtr
  // does, so they keep working after the component and the registry are gone.
  std::shared_ptr<void> library() const { return library_.lock(); }

 private:
  friend class Registry;
  // Weak: the registry's owning pointer holds the library and drops it after the component is
  // destroyed; a strong reference here would unload the library inside the component's own
  // destructor.
  std::weak_ptr<void> library_;
};

// A reference to `object` that holds `library` as well and releases the object first, then the
// library. The reference count lives in the SDK library, so the code that drops the last reference
// to a plugin library never runs from inside that library.
std::shared_ptr<void> hold_library(std::shared_ptr<void> object, std::shared_ptr<void> library);

// `object`, keeping `library` loaded for as long as any copy of the returned pointer lives.
// Without a library (a component built into the host) the object is returned as it is.
template <typename T>
std::shared_ptr<T> keep_library_loaded(std::shared_ptr<T> object, std::shared_ptr<void> library) {
  if (!object || !library) return object;
  T* raw = object.get();
  std::shared_ptr<void> held = hold_library(
      std::const_pointer_cast<std::remove_const_t<T>>(std::move(object)), std::move(library));
  return std::shared_ptr<T>(std::move(held), raw);
}

}  // namespace trainyard
