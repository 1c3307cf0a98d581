// Package protocol is what package stock and its Lua scripts (lua/*.lua) agree on: the keys of
// an item and the order the scripts take them in, the reply codes, the text formats the
// scripts write (ledger entries, outbox members, cart records), and the script handles. Every
// constant here has a twin in the scripts; TestReplyCodesMatchLua checks the reply codes against
// lua/lib.lua.
package protocol
