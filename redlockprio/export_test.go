package redlockprio

// ScriptNames names the package's Lua scripts by their SHA1, for the
// tests that record what a Locker sends to its masters.
var ScriptNames = map[string]string{
	acquireScript.Hash(): "acquire",
	releaseScript.Hash(): "release",
	renewScript.Hash():   "renew",
	raiseScript.Hash():   "raise",
}
