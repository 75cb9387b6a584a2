// Package meshtun is the root of the meshtun node gateway. The code lives
// in its sub-packages (see ARCHITECTURE.md); this package holds only
// repository-wide tests, such as the check of package import directions.
package meshtun
