//go:build race

package main

// raceEnabled: the gateways under test are built with -race too.
const raceEnabled = true
