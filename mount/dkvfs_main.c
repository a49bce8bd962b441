/* mount/dkvfs_main.c — `dkvfs [-f] [-o OPTS] MOUNTPOINT` (see mount/mnt.h). */
#include "mount/mnt.h"

int main(int argc, char **argv)
{
	return mnt_main(argc, argv);
}
