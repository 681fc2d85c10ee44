// Package release is the logic behind latchkey's release targets
// (`go run mage.go release VERSION`, `releaseDryRun VERSION` and
// `releaseCheck`): which workspace modules are released, the order they
// are tagged in, what a released go.mod may hold, packing modules into a
// file-based module proxy, building a consumer of each backend outside the
// workspace, and the release commit, CHANGELOG entry and tags.
//
// The magefile supplies a [Policy] (which module is what) and the module
// directories of go.work; everything here works on a directory tree, so
// the tests drive it on small fake trees.
//
// Every released module is tagged with the same version at once, and its
// requirements on its siblings name that version (docs/versioning.md).
package release
